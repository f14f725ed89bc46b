#!/usr/bin/env bash
# Configures (Release, CUDA for sm_90a when nvcc is found) and builds everything into build/.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
if [[ ! -f $BUILD_DIR/CMakeCache.txt ]]; then
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release "$@"
fi
cmake --build "$BUILD_DIR" -j "$jobs" ${BUILD_TARGET:+--target "$BUILD_TARGET"}
