# Sourced by the GPU scripts (gpu-check.sh, gpu-bench.sh, gpu-ab.sh). ensure_built BUILD_DIR FILE...: when one of
# the binaries (paths relative to BUILD_DIR) is missing, builds with scripts/build.sh; when that fails (the GPU
# machine lacks cpp-httplib, pcre2 and utf8proc), says how to bring the binaries instead and exits.
ensure_built() {
  local build=$1 f missing=()
  shift
  for f in "$@"; do [[ -x $build/$f ]] || missing+=("$f"); done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  local root log
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  log=$(mktemp /tmp/moeserve-build.XXXXXX.log)
  echo "missing in $build: ${missing[*]}; building with scripts/build.sh (log: $log)"
  if ! BUILD_DIR=$build "$root/scripts/build.sh" >"$log" 2>&1; then
    tail -5 "$log"
    echo "error: the build failed here. Build on a machine with the dependencies (./scripts/install-deps.sh," \
      "./scripts/build.sh) and bring $build along (scripts/pack-for-gpu.sh packs what is needed)." >&2
    exit 1
  fi
  for f in "$@"; do
    [[ -x $build/$f ]] || { echo "error: $build/$f is still missing after the build" >&2; exit 1; }
  done
}
