#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole CPU test suite (GPU tests skip without a GPU).
# Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j "${JOBS:-$(nproc)}" --timeout 900
