#!/usr/bin/env bash
# Same-call A/B of the decode-step switches (docs/ARCHITECTURE.md, "opt-in GPU experiments") on the served decode
# step of q30b8l at bs 1, 2, 8, 64 and 128 (scripts/gpu-ab.sh over build/bench/gpu_profile; ~7 s a variant), three
# rounds: the defaults; the opt-in switches of decode steps (the final norm inside the streaming lm_head,
# MOESERVE_LMHEAD_NORM_IN=1; the lm_head without its screen, MOESERVE_LMHEAD_SCREEN=0; the screen's picks
# as their own launches, MOESERVE_LMHEAD_SCREEN_FOLD=0); the defaults' earlier forms (the cuBLASLt lm_head MOESERVE_GEMV_STREAM=0; session
# 18's greedy cluster form, 4-stage GEMV and down GEMV rings). Extra variants: AB_EXTRA="name=SETTINGS ...", added to
# every round. Then kernel traces at bs 1 and 64 with the defaults (OUT/trace_bs1.log, OUT/trace_bs64.log).
# Makes the model with gen-model when missing. Env: OUT (logs), MOESERVE_BUILD, MODEL (default
# /tmp/moeserve-bench/q30b8l), AB_EXTRA.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${MOESERVE_BUILD:-$ROOT/build}
M=${MODEL:-/tmp/moeserve-bench/q30b8l}
OUT=${OUT:-/tmp/gpu-opt-in-ab}
mkdir -p "$OUT"
t0=$SECONDS
[[ -f $M/config.json ]] || "$BUILD/bin/moeserve" gen-model --preset q30b8l --output "$M" >/dev/null
echo "model ready at $((SECONDS - t0)) s"
export AB_FLAGS="--batch-sizes 1,2,8,64,128 --prefill=false"
EARLIER="MOESERVE_GREEDY_GRID=0 MOESERVE_GEMV_RING_STAGES=4 MOESERVE_MOE_DOWN_GEMV_STAGES=4"
read -r -a extra <<<"${AB_EXTRA:-}"
variants=()
for r in a b c; do
  variants+=("base$r=" "normin$r=MOESERVE_LMHEAD_NORM_IN=1" "noscreen$r=MOESERVE_LMHEAD_SCREEN=0"
             "nofold$r=MOESERVE_LMHEAD_SCREEN_FOLD=0")
  for v in "${extra[@]}"; do variants+=("${v%%=*}$r=${v#*=}"); done
done
variants+=("cublas=MOESERVE_GEMV_STREAM=0" "earlier=$EARLIER")
OUT=$OUT/ab "$ROOT/scripts/gpu-ab.sh" "$M" "${variants[@]}"
prof() { timeout 60 "$BUILD/bench/gpu_profile" --model-path "$M" --prefill=false --trace "$@"; }
prof --batch-sizes 1 >"$OUT/trace_bs1.log" 2>&1
prof --batch-sizes 64 >"$OUT/trace_bs64.log" 2>&1
echo "done at $((SECONDS - t0)) s"
