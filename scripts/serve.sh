#!/usr/bin/env bash
# Installs what is missing, builds, and runs moeserve on the built-in demo model (made on first use).
# Extra arguments are passed on to `moeserve serve` (e.g. --model-path DIR --port 30001).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
BUILD_TARGET=moeserve ./scripts/build.sh
if ./build/bin/moeserve serve --help >/dev/null 2>&1; then
  exec ./build/bin/moeserve serve --host 127.0.0.1 --port 30000 "$@"
fi
exec ./build/bin/moeserve generate --input-ids 151644,872,198,9707,151645,198,151644,77091,198 \
  --max-new-tokens 32 --log-level info "$@"
