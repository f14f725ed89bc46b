#!/usr/bin/env bash
# Every GPU check in one run on the GPU machine, a short table last:
#   - the binary's dynamic libraries (everything but CUDA static or header-only);
#   - every GPU test binary (kernels, GEMM, sampling, MoE backends, GPU parity against transformers);
#   - `moeserve backends`, and the refusal of a backend compiled for another architecture;
#   - the server end-to-end suite on the GPU (--device auto picks the GPU there).
# Builds when the binaries are missing (scripts/lib/ensure-built.sh); on the GPU machine, which lacks some build
# dependencies, build on the development machine (./scripts/build.sh) and carry build/ along.
# Env: MOESERVE_BUILD (default build), GPU_CHECK_E2E=0 to skip the node suite, GPU_CHECK_VARIANTS=0 to skip the rows
# that rerun a test binary with a non-default path switched on, GPU_CHECK_TIMINGS=1 to add the
# kernel timing reports, GPU_CHECK_FROM=NAME to start at row NAME (the rest of a run cut by a time limit),
# GPU_CHECK_SKIP=REGEX to leave out the rows whose names match, OUT: where gpu-check-logs.tgz (every log; scripts/lib/archive.sh) goes; the logs themselves are written under /tmp, so
# that a device run brings back one archive rather than dozens of files.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${MOESERVE_BUILD:-$ROOT/build}
source "$ROOT/scripts/lib/ensure-built.sh"
ensure_built "$BUILD" bin/moeserve tests/test_cuda
LOGS=$(mktemp -d /tmp/gpu-check.XXXXXX)
source "$ROOT/scripts/lib/archive.sh"
ARCHIVE=$(log_archive gpu-check)
export MOESERVE_TEST_DATA=$ROOT/tests/data
export MOESERVE_CACHE=${MOESERVE_CACHE:-/tmp/moeserve-cache}
export NCCL_NVLS_ENABLE=0
BIN=$BUILD/bin/moeserve
rows=()

# run NAME EXPECT CMD...: EXPECT is "ok" (exit 0) or "fail" (must exit non-zero).
run() {
  local name=$1 expect=$2
  shift 2
  if [[ -n ${GPU_CHECK_FROM:-} ]]; then
    [[ $name == "$GPU_CHECK_FROM" ]] || return 0
    GPU_CHECK_FROM=""
  fi
  [[ -n ${GPU_CHECK_SKIP:-} && $name =~ $GPU_CHECK_SKIP ]] && return 0
  local t0=$(date +%s%N)
  "$@" >"$LOGS/$name.log" 2>&1
  local rc=$? t1=$(date +%s%N)
  local verdict=PASS
  if [[ $expect == ok && $rc -ne 0 ]] || [[ $expect == fail && $rc -eq 0 ]]; then verdict=FAIL; fi
  local summary
  summary=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) |^# (pass|fail) |^error:' "$LOGS/$name.log" | tr '\n' ' ' | cut -c1-90)
  rows+=("$(printf '%-34s %-5s %7.1f s  %s' "$name" "$verdict" "$(( (t1 - t0) / 1000000 ))e-3" "$summary")")
  echo "${rows[-1]}"  # as it completes too: a run cut short by a time limit still shows what passed
  if [[ $verdict == FAIL ]]; then
    echo "----- $name (rc $rc) -----"
    grep -E 'FAILED|Failure|error|Error|expected|Which is|Expected|actual' "$LOGS/$name.log" | head -40
  fi
}
# variant NAME EXPECT CMD...: a row that runs a test binary again with a non-default path switched on (an env
# variable); GPU_CHECK_VARIANTS=0 leaves them all out (the defaults only: every test binary, backends, the refusal, e2e).
variant() {
  [[ ${GPU_CHECK_VARIANTS:-1} == 0 ]] && return 0
  run "$@"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "non-system dynamic libraries of moeserve:"
ldd "$BIN" | grep -v -E 'linux-vdso|libc\.so|libm\.so|ld-linux|libpthread|libdl|librt' || true

# BF16 parity fixtures (reference computed by transformers on the exact BF16 weights), made here if missing.
if [[ ! -f $ROOT/tests/data/parity_bf16/reference.json ]] && python3 -c 'import transformers' 2>/dev/null; then
  python3 "$ROOT/tools/reference/make_parity_fixtures.py" --dtype bfloat16 --out "$ROOT/tests/data/parity_bf16" \
    >"$LOGS/make_bf16_fixtures.log" 2>&1 && tar czf "$LOGS/parity_bf16.tgz" -C "$ROOT/tests/data" parity_bf16
fi

for t in "$BUILD"/tests/test_cuda* "$BUILD"/tests/test_gpu_*; do
  [[ -x $t ]] || continue
  run "$(basename "$t")" ok "$t" --gtest_brief=1
done
# The prefill tiles of configuration 10 (the default before session 37; 14 has the tokens as the MMAs' M), from 40
# tokens an expert so that the odd shapes take them too; and 14 there.
variant test_cuda_moe_prefill10 ok env MOESERVE_MOE_WS_PREFILL=10 MOESERVE_MOE_WS_PREFILL_MIN=40 "$BUILD/tests/test_cuda_moe" \
  --gtest_brief=1
variant test_cuda_moe_prefill14_min40 ok env MOESERVE_MOE_WS_PREFILL_MIN=40 "$BUILD/tests/test_cuda_moe" --gtest_brief=1
# The fused MoE kernels once more without the warp-specialized configurations (configurations 1 and 6 are what
# the default picks where the kernel table has no sm_90a code).
variant test_cuda_moe_ws0 ok env MOESERVE_MOE_WS=0 "$BUILD/tests/test_cuda_moe" --gtest_brief=1
# 12-40 tokens an expert on the non-warp-specialized wgmma tiles (configuration 5) with the others warp-specialized.
variant test_cuda_moe_mid5 ok env MOESERVE_MOE_WS_MID=5 "$BUILD/tests/test_cuda_moe" --gtest_brief=1 \
  --gtest_filter='*Shapes*:*CapturedGraph*:*Skewed*:*SelfTest*'
# Batched decode's warp-specialized tiles as configuration 9 (one CTA an SM, 64-token tiles, TMA weights) and 11
# (12's shape with TMA weights; the default is 12, cp.async weights).
variant test_cuda_moe_ws_decode9 ok env MOESERVE_MOE_WS_DECODE=9 "$BUILD/tests/test_cuda_moe" --gtest_brief=1
variant test_gpu_model_ws_decode9 ok env MOESERVE_MOE_WS_DECODE=9 "$BUILD/tests/test_gpu_model" --gtest_brief=1
variant test_cuda_moe_ws_decode11 ok env MOESERVE_MOE_WS_DECODE=11 "$BUILD/tests/test_cuda_moe" --gtest_brief=1
# Batched decode with the prep launch (MOESERVE_MOE_INLINE_ROUTE=0; the default builds the tile table in the GEMMs),
# and the inline table without static slots.
variant test_gpu_model_prep_launch ok env MOESERVE_MOE_INLINE_ROUTE=0 "$BUILD/tests/test_gpu_model" --gtest_brief=1
variant test_cuda_moe_inline_noprewait ok env MOESERVE_MOE_GU_PREWAIT=0 "$BUILD/tests/test_cuda_moe" --gtest_brief=1 \
  --gtest_filter='*Inline*:*Skewed*'
# The 1-token down GEMM with its last-CTA combine (MOESERVE_MOE_DOWN_GEMV=0; the default is the down GEMV + combine
# launch) against the CPU reference: the direct-mode tests.
variant test_cuda_moe_down_gemm ok env MOESERVE_MOE_DOWN_GEMV=0 "$BUILD/tests/test_cuda_moe" --gtest_brief=1 \
  --gtest_filter='*SmallTokenCounts*:*CudaMoeShapes*:*SelfTest*'
# The decode weight streams without the L2 evict_first hint (MOESERVE_L2_EVICT_FIRST=0, the plain cp.async), and the
# cluster decode attention with the 3-stage ring at every grid (MOESERVE_ATTN_GQA_CLUSTER_STAGES=3; the default takes
# 2 stages for grids of at most half the SMs).
variant test_cuda_moe_no_evict_first ok env MOESERVE_L2_EVICT_FIRST=0 "$BUILD/tests/test_cuda_moe" --gtest_brief=1 \
  --gtest_filter='*SmallTokenCounts*:*Residual*:*Captured*:*SelfTest*'
variant test_cuda_kernels_stages3 ok env MOESERVE_ATTN_GQA_CLUSTER_STAGES=3 "$BUILD/tests/test_cuda_kernels" --gtest_brief=1 \
  --gtest_filter='*Decode*'
# The split decode attention with its merge launch instead of the cluster merge (MOESERVE_ATTN_CLUSTER_MERGE=0), and
# the fused input stage in the 16-row tiles where the keys-as-M tiles would take it (MOESERVE_ATTN_GQA_FUSED_IN=0).
variant test_cuda_kernels_merge_launch ok env MOESERVE_ATTN_CLUSTER_MERGE=0 MOESERVE_ATTN_GQA_FUSED_IN=0 \
  "$BUILD/tests/test_cuda_kernels" --gtest_brief=1
# The two-CTA wgmma prefill attention tiles (MOESERVE_ATTN_PREFILL_WS=0; the default is the warp-specialized form).
variant test_cuda_kernels_prefill_2cta ok env MOESERVE_ATTN_PREFILL_WS=0 "$BUILD/tests/test_cuda_kernels" --gtest_brief=1 \
  --gtest_filter='*Prefill*:*Graph*'
# The warp-specialized form walking the grid order instead of its work list (MOESERVE_ATTN_WS_ORDER=0).
variant test_cuda_kernels_prefill_grid_order ok env MOESERVE_ATTN_WS_ORDER=0 "$BUILD/tests/test_cuda_kernels" \
  --gtest_brief=1 --gtest_filter='*Prefill*'
# The other norm paths: the residual fusion and the GEMV ring off (MOESERVE_RESIDUAL_FUSION=0 MOESERVE_GEMV_RING=0:
# norm launches and register-streaming GEMVs), and the opt-in combine-norm fusion (MOESERVE_MOE_COMBINE_NORM=1 at
# every step whose MoE ends in a combine launch): the model on the GPU, and the parity against transformers with
# the combine-norm (the parity run adds ~2 minutes); the GEMM tests with the register-streaming loop.
variant test_cuda_gemm_noring ok env MOESERVE_GEMV_RING=0 "$BUILD/tests/test_cuda_gemm" --gtest_brief=1
variant test_gpu_model_norm_paths ok env MOESERVE_RESIDUAL_FUSION=0 MOESERVE_GEMV_RING=0 MOESERVE_MOE_COMBINE_NORM=1 \
  "$BUILD/tests/test_gpu_model" --gtest_brief=1
variant test_gpu_parity_combine_norm ok env MOESERVE_MOE_COMBINE_NORM=1 "$BUILD/tests/test_gpu_parity" --gtest_brief=1
# The streaming lm_head of session 20 off (cuBLASLt at every token count, MOESERVE_GEMV_STREAM=0); with the opt-in
# final norm inside it: test_gpu_model_opt_in below.
variant test_gpu_model_cublaslt_head ok env MOESERVE_GEMV_STREAM=0 "$BUILD/tests/test_gpu_model" --gtest_brief=1
# The decode-step switches of session 16 off: the unfolded router (router GEMV + route launch), layer 0's norm
# launch instead of the embedding's partial sums, and every step copy on the compute stream.
variant test_gpu_model_unfolded ok env MOESERVE_ROUTER_FOLD=0 MOESERVE_EMBED_PARTIALS=0 MOESERVE_STEP_STREAMS=0 \
  "$BUILD/tests/test_gpu_model" --gtest_brief=1
# Session 17's experiments made defaults in session 18 (greedy grid form up to 128 rows, o_proj's 8/6-stage GEMV
# ring, the down GEMV's 8-stage ring): the earlier forms once more (MOESERVE_GREEDY_GRID=0 / 1,
# MOESERVE_GEMV_RING_STAGES=4, MOESERVE_MOE_DOWN_GEMV_STAGES=2, 3, 4), and the decode attention's three dependent
# entry loads (MOESERVE_ATTN_EARLY_META=0; one round trip by default since session 48). The opt-in switches (off by
# default; their same-call A/Bs measured even or slower): the final norm inside the streaming lm_head GEMV at decode
# (MOESERVE_LMHEAD_NORM_IN=1; also test_cuda_gemm's StreamingGemvNormInMatchesNormInRows, which runs it directly) and
# the folded route of 9-128-token decode steps (MOESERVE_ROUTER_FOLD_MID=1; test_gpu_router_fold runs its kernel).
# The other opt-in experiments were removed after their A/Bs (docs/ARCHITECTURE.md lists them, docs/PERF.md has
# the figures).
EARLIER=(MOESERVE_GREEDY_GRID=0 MOESERVE_GEMV_RING_STAGES=4 MOESERVE_MOE_DOWN_GEMV_STAGES=4 MOESERVE_ATTN_EARLY_META=0)
OPT_IN=(MOESERVE_LMHEAD_NORM_IN=1 MOESERVE_ROUTER_FOLD_MID=1)
variant test_gpu_model_earlier ok env "${EARLIER[@]}" "$BUILD/tests/test_gpu_model" --gtest_brief=1
variant test_gpu_model_opt_in ok env "${OPT_IN[@]}" "$BUILD/tests/test_gpu_model" --gtest_brief=1
variant test_gpu_parity_opt_in ok env "${OPT_IN[@]}" "$BUILD/tests/test_gpu_parity" --gtest_brief=1 --gtest_filter='*Bf16*'
# The lm_head screen for greedy steps of 1-64 rows is the default since session 45 (its kernels' own tests are
# test_gpu_lmhead_screen's); the GPU model's greedy tokens and the parity fixtures without it (MOESERVE_LMHEAD_SCREEN=0).
variant test_gpu_model_noscreen ok env MOESERVE_LMHEAD_SCREEN=0 "$BUILD/tests/test_gpu_model" --gtest_brief=1
variant test_gpu_parity_noscreen ok env MOESERVE_LMHEAD_SCREEN=0 "$BUILD/tests/test_gpu_parity" --gtest_brief=1 \
  --gtest_filter='*Bf16*'
# The screen's picks as their own launches (MOESERVE_LMHEAD_SCREEN_FOLD=0; folded by default since session 46).
variant test_gpu_lmhead_screen_unfolded ok env MOESERVE_LMHEAD_SCREEN_FOLD=0 "$BUILD/tests/test_gpu_lmhead_screen" --gtest_brief=1
variant test_gpu_model_screen_unfolded ok env MOESERVE_LMHEAD_SCREEN_FOLD=0 "$BUILD/tests/test_gpu_model" --gtest_brief=1 \
  --gtest_filter='*Screen*:*32Sequences*:*LaunchedAhead*'
# The 1-8-row screen form at every row count it may take (MOESERVE_SCREEN_WIDE_FROM=9; from 5 rows the wide form takes
# them on sm_90 by default since session 50), and the wide form from 2 rows.
for w in 9 2; do
  variant "test_gpu_lmhead_screen_wide_from$w" ok env MOESERVE_SCREEN_WIDE_FROM=$w "$BUILD/tests/test_gpu_lmhead_screen" \
    --gtest_brief=1
done
for g in 0 1; do
  variant "test_cuda_sampling_greedy_grid$g" ok env MOESERVE_GREEDY_GRID=$g "$BUILD/tests/test_cuda_sampling_greedy" \
    --gtest_brief=1
done
# sample()'s two block forms, each forced for every launch (the default switches at SMs / 8 + 1 rows; session 53).
variant test_cuda_sampling_form256 ok env MOESERVE_SAMPLE_WIDE_FROM=1 "$BUILD/tests/test_cuda_sampling" --gtest_brief=1
variant test_cuda_sampling_form512 ok env MOESERVE_SAMPLE_WIDE_FROM=1000000 "$BUILD/tests/test_cuda_sampling" --gtest_brief=1
variant test_cuda_gemm_ring4 ok env MOESERVE_GEMV_RING_STAGES=4 "$BUILD/tests/test_cuda_gemm" --gtest_brief=1
# The streaming lm_head's other ring forms (default: 4 stages, two blocks an SM since session 21): session 20's one
# 8-stage block an SM, and two 6-stage blocks.
for st in 6 8; do
  variant "test_cuda_gemm_stream$st" ok env MOESERVE_GEMV_STREAM_STAGES=$st "$BUILD/tests/test_cuda_gemm" --gtest_brief=1 \
    --gtest_filter='*Stream*'
done
# The 1-token down GEMV with the other ring depths (MOESERVE_MOE_DOWN_GEMV_STAGES=2, 3, 4), the direct-mode tests.
for st in 2 3 4; do
  variant "test_cuda_moe_down_stages$st" ok env MOESERVE_MOE_DOWN_GEMV_STAGES=$st "$BUILD/tests/test_cuda_moe" \
    --gtest_brief=1 --gtest_filter='*SmallTokenCounts*:*Residual*:*Captured*:*SelfTest*'
done
variant test_gpu_router_fold_ring4 ok env MOESERVE_GEMV_RING_STAGES=4 "$BUILD/tests/test_gpu_router_fold" \
  --gtest_brief=1
# The mma.sync prefill attention tiles at head_dim 128 too (the default there is the wgmma kernel on sm_90), and the
# 16-row decode tiles (the default at head_dim 128 and groups of up to 8 is the keys-as-M kernel).
variant test_cuda_kernels_mma ok env MOESERVE_ATTN_PREFILL_WGMMA=0 MOESERVE_ATTN_DECODE_GQA_MIN=0 "$BUILD/tests/test_cuda_kernels" --gtest_brief=1
run backends ok "$BIN" backends
grep -E "moe|attention|gemm|sampling" "$LOGS/backends.log" 2>/dev/null | cut -c1-200
run refuse_sm100_backend fail "$BIN" serve --moe-runner-backend fused_sm100_build --port 39999
grep -h error "$LOGS/refuse_sm100_backend.log" 2>/dev/null | head -2

if [[ ${GPU_CHECK_E2E:-1} != 0 ]] && command -v node >/dev/null; then
  for t in api limits parity; do
    run "e2e_$t" ok env MOESERVE_BIN="$BIN" MOESERVE_E2E_ARGS="--mem-fraction-static 0.08" MOESERVE_E2E_GPU=1 node --test --test-reporter=tap "$ROOT/tests/server/$t.test.mjs"
  done
fi

# Optional: the kernel timings too (MoE layer against its floor, sampler, GEMV bandwidth, attention), all in one call.
if [[ ${GPU_CHECK_TIMINGS:-0} != 0 ]]; then
  "$BUILD/tests/test_cuda_moe" --gtest_also_run_disabled_tests --gtest_filter='*TimingReport*' >"$LOGS/moe_timing.log" 2>&1
  "$BUILD/tests/test_cuda_sampling" --gtest_also_run_disabled_tests --gtest_filter='*Timing*' >"$LOGS/sampling_timing.log" 2>&1
  "$BUILD/tests/test_cuda_gemm" --gtest_also_run_disabled_tests --gtest_filter='*Bandwidth*' >"$LOGS/gemm_bandwidth.log" 2>&1
  "$BUILD/tests/test_cuda_kernels" --gtest_also_run_disabled_tests --gtest_filter='*AttentionTiming*' >"$LOGS/attention_timing.log" 2>&1
  grep -h 'info' "$LOGS/attention_timing.log" | cut -c1-150
  grep -h 'info' "$LOGS/moe_timing.log" | grep -E 'T= *1 |T= *64 ' | cut -c1-150
fi

tar czf "$ARCHIVE" -C "$LOGS" . 2>/dev/null && echo "logs: $ARCHIVE"
echo
grep -h '^\[ info \]' "$LOGS"/test_cuda.log "$LOGS"/test_gpu_*.log 2>/dev/null | cut -c1-150
printf '%-34s %-5s %9s  %s\n' check result time summary
printf '%s\n' "${rows[@]}"
