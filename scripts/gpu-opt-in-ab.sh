#!/usr/bin/env bash
# Same-call A/B of the decode-step switches (docs/ARCHITECTURE.md, "opt-in GPU experiments") on the served decode
# step of q30b8l at bs 1, 2 and 64 (scripts/gpu-ab.sh over build/bench/gpu_profile; ~6 s a variant): the defaults,
# session 17's experiments as they were before session 18 made them defaults (greedy cluster form, 4-stage GEMV and
# down GEMV rings), one at a time and together, the still opt-in ones (layer-0 prefetch, head-dimension split
# attention, also with 128-key parts, the router + top-k launch for 2-128 tokens, the 1-token route starting the
# chosen experts' gate/up weights towards L2, the 1-token down GEMV starting the next layer's q/k/v weights towards
# L2 once its own have landed), MOESERVE_EMBED_PARTIALS=0, the
# defaults again; then a bs 1 kernel trace with
# the opt-in ones on and off (OUT/trace_opt_in.log, OUT/trace_base.log).
# Makes the model with gen-model when missing. Env: OUT (logs), MOESERVE_BUILD, MODEL (default
# /tmp/moeserve-bench/q30b8l).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${MOESERVE_BUILD:-$ROOT/build}
M=${MODEL:-/tmp/moeserve-bench/q30b8l}
OUT=${OUT:-/tmp/gpu-opt-in-ab}
mkdir -p "$OUT"
t0=$SECONDS
[[ -f $M/config.json ]] || "$BUILD/bin/moeserve" gen-model --preset q30b8l --output "$M" >/dev/null
echo "model ready at $((SECONDS - t0)) s"
OPT_IN="MOESERVE_PREFETCH_FIRST_LAYER=1 MOESERVE_ATTN_GQA_DSPLIT=1 MOESERVE_ROUTER_TOPK_WIDE=1 MOESERVE_ROUTE_PREFETCH_EXPERTS=1 MOESERVE_MOE_PREFETCH_NEXT=1"
EARLIER="MOESERVE_GREEDY_GRID=0 MOESERVE_GEMV_RING_STAGES=4 MOESERVE_MOE_DOWN_GEMV_STAGES=4"
export AB_FLAGS="--batch-sizes 1,2,64 --prefill=false"
OUT=$OUT/ab "$ROOT/scripts/gpu-ab.sh" "$M" base= "earlier=$EARLIER" grid0=MOESERVE_GREEDY_GRID=0 \
  ring4=MOESERVE_GEMV_RING_STAGES=4 down4=MOESERVE_MOE_DOWN_GEMV_STAGES=4 pref=MOESERVE_PREFETCH_FIRST_LAYER=1 \
  dsplit=MOESERVE_ATTN_GQA_DSPLIT=1 "dsplit128=MOESERVE_ATTN_GQA_DSPLIT=1 MOESERVE_ATTN_MIN_SPLIT_KEYS=128" \
  wide=MOESERVE_ROUTER_TOPK_WIDE=1 pexp=MOESERVE_ROUTE_PREFETCH_EXPERTS=1 noemb=MOESERVE_EMBED_PARTIALS=0 base2= \
  wide2=MOESERVE_ROUTER_TOPK_WIDE=1 pexp2=MOESERVE_ROUTE_PREFETCH_EXPERTS=1 pnext=MOESERVE_MOE_PREFETCH_NEXT=1 \
  "pboth=MOESERVE_ROUTE_PREFETCH_EXPERTS=1 MOESERVE_MOE_PREFETCH_NEXT=1" base3= pnext2=MOESERVE_MOE_PREFETCH_NEXT=1
env $OPT_IN timeout 60 "$BUILD/bench/gpu_profile" --model-path "$M" --batch-sizes 1 --prefill=false --trace \
  >"$OUT/trace_opt_in.log" 2>&1
timeout 60 "$BUILD/bench/gpu_profile" --model-path "$M" --batch-sizes 1 --prefill=false --trace \
  >"$OUT/trace_base.log" 2>&1
echo "done at $((SECONDS - t0)) s"
