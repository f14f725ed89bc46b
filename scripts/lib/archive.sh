# Sourced by scripts/gpu-bench.sh, gpu-check.sh and gpu-ab.sh: where a run's logs go as one archive.
#   log_archive NAME    prints ${OUT:-/tmp}/NAME-logs.tgz, or NAME-logs-2.tgz, -3, ... when a run before it in the same
#                       device call took that name (session 65 lost gpu-bench's logs to the gpu-check run after it,
#                       when all three wrote OUT/logs.tgz); creates the folder.
log_archive() {
  local dir=${OUT:-/tmp} i=2 path
  mkdir -p "$dir"
  path=$dir/$1-logs.tgz
  while [[ -e $path ]]; do path=$dir/$1-logs-$i.tgz; i=$((i + 1)); done
  echo "$path"
}
