# Sourced (from the tree's root, on the GPU machine) by a device-call script such as .gpu-carry/run-*.sh: unpacks
# the carried binaries (scripts/pack-for-gpu.sh's .gpu-carry/carry.tar.xz), sets the test environment, tees all
# output to $OUT/progress.log (a call that runs past its limit still returns what it printed), prints the GPU's
# serial, and defines:
#   t BINARY ARGS...    a test binary under a timeout (T_TIMEOUT, default 250 s), its log in $OUT, a summary printed;
#                       returns its exit status. A shell function: give it variables as `VAR=x t ...` (bash passes
#                       them to its commands) or export them - `env VAR=x t ...` finds no program `t` (session 64)
#   gen_model_start     writes the q30b8l benchmark model to $M (/tmp/m/q30b8l) in the background;
#   gen_model_wait      waits for it by pid. (A bare `wait` also waits for the tee's process substitution, which never
#                       ends: session 40 lost a 500 s call to that.)
[[ -n ${OUT:-} ]] || { echo "device-call.sh: OUT is not set (the device tool sets it)" >&2; exit 2; }
exec > >(tee "$OUT/progress.log") 2>&1
.gpu-carry/unpack.sh >/dev/null
export MOESERVE_CACHE=/tmp/moeserve-cache MOESERVE_TEST_DATA=$PWD/tests/data
nvidia-smi --query-gpu=serial --format=csv,noheader
M=${M:-/tmp/m/q30b8l}
t() {
  local log=$OUT/test-$RANDOM.log
  echo "-- $*"
  timeout "${T_TIMEOUT:-250}" "$@" >"$log" 2>&1
  local rc=$?
  echo "rc=$rc ($log)"
  grep -E "^\[  (PASSED|FAILED) |FAILED|Failure|Expected|actual|step .* sequence|error|illegal|\[ info" "$log" | head -12
  return $rc
}
gen_model_pid=
gen_model_start() { build/bin/moeserve gen-model --preset q30b8l --output "$M" >/dev/null 2>&1 & gen_model_pid=$!; }
gen_model_wait() { [[ -z $gen_model_pid ]] || wait "$gen_model_pid"; }
