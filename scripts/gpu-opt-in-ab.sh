#!/usr/bin/env bash
# Same-call A/B of the decode-step switches (docs/ARCHITECTURE.md, "opt-in GPU experiments") on the served decode
# step of q30b8l at bs 1, 2, 8 and 64 (scripts/gpu-ab.sh over build/bench/gpu_profile; ~6 s a variant), each new one
# twice: the defaults; session 21's greedy sampler inside the streaming lm_head (MOESERVE_GREEDY_IN_LMHEAD=1, bs <= 8)
# and its batched-decode switches, three times (MOESERVE_GEMV_KERNEL_MAX_M=64: the gemv
# backend's wide kernel instead of cuBLASLt for the q/k/v, o_proj and router GEMMs of 9-64 tokens;
# MOESERVE_GREEDY_GRID_BLOCKS=1024 (and 512 once): the greedy grid's blocks in all); session 20's one 8-stage
# lm_head block an SM (MOESERVE_GEMV_STREAM_STAGES=8; the default is two 4-stage blocks since session 21), the final
# norm inside the streaming lm_head GEMV (MOESERVE_LMHEAD_NORM_IN=1, bs <= 8) and the cuBLASLt lm_head
# (MOESERVE_GEMV_STREAM=0); session 18's defaults in their earlier forms (greedy cluster form, 4-stage GEMV and down
# GEMV rings); the older opt-in ones (layer-0 prefetch, head-dimension split attention, the router + top-k launch for
# 2-128 tokens; the 1-token gate/up GEMM's 5-deep ring, MOESERVE_MOE_DIRECT_GU_CONFIG=7, last measured in session
# 11); the defaults again. Then kernel traces at bs 1 and bs 64 with the defaults and at bs 64 with both
# new switches and at bs 1 with the greedy sampler in the lm_head (OUT/trace_base.log, OUT/trace_bs64.log,
# OUT/trace_bs64_optin.log, OUT/trace_gih.log). Last, the prefill attention with
# its block-table entries two tiles ahead (MOESERVE_ATTN_PREFILL_TABLE_AHEAD=1) against the default: kernel timing
# rows and the prompt steps' per-op tables (OUT/attn_timing_*.log, OUT/prefill_*.log).
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
EARLIER="MOESERVE_GREEDY_GRID=0 MOESERVE_GEMV_RING_STAGES=4 MOESERVE_MOE_DOWN_GEMV_STAGES=4"
export AB_FLAGS="--batch-sizes 1,2,8,64 --prefill=false"
OUT=$OUT/ab "$ROOT/scripts/gpu-ab.sh" "$M" base= gih=MOESERVE_GREEDY_IN_LMHEAD=1 kmax64=MOESERVE_GEMV_KERNEL_MAX_M=64 \
  gblk1024=MOESERVE_GREEDY_GRID_BLOCKS=1024 gblk512=MOESERVE_GREEDY_GRID_BLOCKS=512 s8=MOESERVE_GEMV_STREAM_STAGES=8 \
  normin=MOESERVE_LMHEAD_NORM_IN=1 cublas=MOESERVE_GEMV_STREAM=0 "earlier=$EARLIER" \
  pref=MOESERVE_PREFETCH_FIRST_LAYER=1 dsplit=MOESERVE_ATTN_GQA_DSPLIT=1 wide=MOESERVE_ROUTER_TOPK_WIDE=1 base2= \
  gihb=MOESERVE_GREEDY_IN_LMHEAD=1 kmax64b=MOESERVE_GEMV_KERNEL_MAX_M=64 gblk1024b=MOESERVE_GREEDY_GRID_BLOCKS=1024 \
  base3= gihc=MOESERVE_GREEDY_IN_LMHEAD=1 \
  kmax64c=MOESERVE_GEMV_KERNEL_MAX_M=64 gblk1024c=MOESERVE_GREEDY_GRID_BLOCKS=1024 dgu7=MOESERVE_MOE_DIRECT_GU_CONFIG=7
prof() { timeout 60 "$BUILD/bench/gpu_profile" --model-path "$M" --prefill=false --trace "$@"; }
prof --batch-sizes 1 >"$OUT/trace_base.log" 2>&1
prof --batch-sizes 64 >"$OUT/trace_bs64.log" 2>&1
MOESERVE_GEMV_KERNEL_MAX_M=64 MOESERVE_GREEDY_GRID_BLOCKS=1024 prof --batch-sizes 64 >"$OUT/trace_bs64_optin.log" 2>&1
MOESERVE_GREEDY_IN_LMHEAD=1 prof --batch-sizes 1 >"$OUT/trace_gih.log" 2>&1
# The prefill attention with its block-table entries two tiles ahead (MOESERVE_ATTN_PREFILL_TABLE_AHEAD=1), off / on
# twice: the kernel alone (test_cuda_kernels' timing rows: prefill 1 x 512 and 16 x 512) and the prompt steps' per-op
# tables (gpu_profile's "prefill, 1 x 512" and "16 x 512").
for r in 1 2; do
  for ta in 0 1; do
    MOESERVE_ATTN_PREFILL_TABLE_AHEAD=$ta timeout 120 "$BUILD/tests/test_cuda_kernels" --gtest_also_run_disabled_tests \
      --gtest_filter='*AttentionTiming*' >"$OUT/attn_timing_ta${ta}_$r.log" 2>&1
    MOESERVE_ATTN_PREFILL_TABLE_AHEAD=$ta timeout 60 "$BUILD/bench/gpu_profile" --model-path "$M" --batch-sizes 1 \
      >"$OUT/prefill_ta${ta}_$r.log" 2>&1
    echo "table ahead $ta, round $r: $(grep -h 'prefill' "$OUT/attn_timing_ta${ta}_$r.log" | tr -s ' ' | tr '\n' ';')"
  done
done
echo "done at $((SECONDS - t0)) s"
