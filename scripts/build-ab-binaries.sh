#!/usr/bin/env bash
# Builds the GPU test and profiling binaries of several git refs for a same-call A/B on the GPU machine
# (scripts/gpu-moe-binary-ab.sh, gpu-ab.sh's build=DIR, gpu-bench.sh's MOESERVE_BUILD): for each NAME=REF, checks REF
# out in this tree, rebuilds build/ incrementally (only what differs from the last ref recompiles) and packs that
# build with `scripts/pack-for-gpu.sh --baseline NAME OUT` (OUT/baseline-NAME.tar.xz: moeserve, gpu_profile and
# test_cuda_moe, test_gpu_model, test_gpu_parity, stripped and compressed to fit the device tool's carry); then checks
# the starting branch out again and rebuilds it. Needs a clean tree (nothing uncommitted) and a configured build/.
#   scripts/build-ab-binaries.sh .gpu-carry main=main silu=next/silu-fast-divide ws11=next/gu-swiglu-regs
# With OUT = .gpu-carry, unpack.sh extracts each to build-NAME/ on the GPU machine; then
#   scripts/gpu-moe-binary-ab.sh MODEL main=build-main silu=build-silu ws11=build-ws11,MOESERVE_MOE_WS_PREFILL=11
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${1:?usage: build-ab-binaries.sh OUT NAME=REF...}
shift
[[ -z $(git status --porcelain --untracked-files=no) ]] || { echo "uncommitted changes: commit or stash first" >&2; exit 1; }
[[ -f build/CMakeCache.txt ]] || { echo "no configured build/: ./scripts/build.sh first" >&2; exit 1; }
start=$(git symbolic-ref -q --short HEAD || git rev-parse HEAD)
restore() { git checkout -q "$start"; }
trap restore EXIT
# This ref's packer, kept under build/ (ignored, untouched by checkouts) so that older refs, whose
# pack-for-gpu.sh has no --baseline, pack the same way; from there its root is still this tree.
pack=$ROOT/build/.pack-for-gpu.sh
cp "$ROOT/scripts/pack-for-gpu.sh" "$pack"
tests=(test_cuda_moe test_gpu_model test_gpu_parity)
targets=("${tests[@]}" gpu_profile moeserve)
for v in "$@"; do
  name=${v%%=*} ref=${v#*=}
  git checkout -q "$ref"
  echo "== $name: $(git log --oneline -1)"
  # One target a call: `--target a b c` after a checkout once left some of them linked against the previous ref's
  # libraries (session 29).
  for t in "${targets[@]}"; do cmake --build build -j "$(nproc)" --target "$t" >/dev/null; done
  BASELINE_TESTS="${tests[*]}" bash "$pack" --baseline "$name" "$OUT"
done
restore
trap - EXIT
echo "== rebuilding $start"
cmake --build build -j "$(nproc)" >/dev/null
