#!/usr/bin/env bash
# Same-call A/B of the opt-in decode experiments (docs/ARCHITECTURE.md, "opt-in GPU experiments") on the served decode
# step of q30b8l at bs 1, 2 and 64 (scripts/gpu-ab.sh over build/bench/gpu_profile), in two halves that each fit one
# device call of 10 minutes:
#   scripts/gpu-opt-in-ab.sh a   base, greedy grid form up to 4 / 128 rows, layer-0 prefetch, o_proj's 8-stage ring,
#                                the down GEMV at 8 / 2 / 3 stages, base again
#   scripts/gpu-opt-in-ab.sh b   base, the head-dimension split attention (also with 128-key parts), everything on,
#                                MOESERVE_EMBED_PARTIALS=0, base and everything on again; then a bs 1 kernel trace with
#                                everything on and with nothing on (OUT/trace_all.log, OUT/trace_base.log)
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
ALL="MOESERVE_GREEDY_GRID=2 MOESERVE_PREFETCH_FIRST_LAYER=1 MOESERVE_GEMV_RING_STAGES=8 MOESERVE_MOE_DOWN_GEMV_STAGES=8"
ALL+=" MOESERVE_ATTN_GQA_DSPLIT=1"
export AB_FLAGS="--batch-sizes 1,2,64 --prefill=false"
case ${1:-a} in
  a)
    OUT=$OUT/ab_a "$ROOT/scripts/gpu-ab.sh" "$M" base= grid=MOESERVE_GREEDY_GRID=1 grid2=MOESERVE_GREEDY_GRID=2 \
      pref=MOESERVE_PREFETCH_FIRST_LAYER=1 ring8=MOESERVE_GEMV_RING_STAGES=8 down8=MOESERVE_MOE_DOWN_GEMV_STAGES=8 \
      down2=MOESERVE_MOE_DOWN_GEMV_STAGES=2 down3=MOESERVE_MOE_DOWN_GEMV_STAGES=3 base2=
    ;;
  b)
    OUT=$OUT/ab_b "$ROOT/scripts/gpu-ab.sh" "$M" base= dsplit=MOESERVE_ATTN_GQA_DSPLIT=1 \
      "dsplit128=MOESERVE_ATTN_GQA_DSPLIT=1 MOESERVE_ATTN_MIN_SPLIT_KEYS=128" "all=$ALL" \
      noemb=MOESERVE_EMBED_PARTIALS=0 base2= "all2=$ALL"
    env $ALL timeout 60 "$BUILD/bench/gpu_profile" --model-path "$M" --batch-sizes 1 --prefill=false --trace \
      >"$OUT/trace_all.log" 2>&1
    timeout 60 "$BUILD/bench/gpu_profile" --model-path "$M" --batch-sizes 1 --prefill=false --trace \
      >"$OUT/trace_base.log" 2>&1
    ;;
  *) echo "usage: $0 a|b" >&2; exit 2 ;;
esac
echo "done at $((SECONDS - t0)) s"
