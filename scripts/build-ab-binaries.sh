#!/usr/bin/env bash
# Builds the GPU test and profiling binaries of several git refs for a same-call A/B on the GPU machine
# (scripts/gpu-moe-binary-ab.sh): for each NAME=REF, checks REF out in this tree, rebuilds build/ incrementally (only
# what differs from the last ref recompiles) and copies the stripped binaries to OUT/NAME/; then checks the starting
# branch out again and rebuilds it. Needs a clean tree (nothing uncommitted) and a configured build/.
#   scripts/build-ab-binaries.sh OUT main=main silu=next/silu-fast-divide ws11=next/gu-swiglu-regs
# Then carry OUT (e.g. under .gpu-carry/) and run, on the GPU machine,
#   scripts/gpu-moe-binary-ab.sh MODEL main=OUT/main silu=OUT/silu ws11=OUT/ws11,MOESERVE_MOE_WS_PREFILL=11
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
targets=(test_cuda_moe test_gpu_model test_gpu_parity gpu_profile)
for v in "$@"; do
  name=${v%%=*} ref=${v#*=}
  git checkout -q "$ref"
  echo "== $name: $(git log --oneline -1)"
  # One target a call: `--target a b c` after a checkout once left some of them linked against the previous ref's
  # libraries (session 29).
  for t in "${targets[@]}"; do cmake --build build -j "$(nproc)" --target "$t" >/dev/null; done
  mkdir -p "$OUT/$name"
  bins=(build/tests/test_cuda_moe build/tests/test_gpu_model build/tests/test_gpu_parity build/bench/gpu_profile)
  cp "${bins[@]}" "$OUT/$name/"
  for b in "${bins[@]}"; do strip "$OUT/$name/$(basename "$b")"; done
  git rev-parse HEAD >"$OUT/$name/COMMIT"
done
restore
trap - EXIT
echo "== rebuilding $start"
cmake --build build -j "$(nproc)" >/dev/null
