#!/usr/bin/env bash
# Same-call A/B of MoE kernel builds on the GPU machine (the machine differs by a few percent between calls, so only
# same-call figures compare). Each variant is NAME=DIR, DIR holding the binaries test_cuda_moe and gpu_profile of one
# build (a build dir with tests/ and bench/, or a folder they were copied to before a change: on the dev machine,
# `cp build/tests/test_cuda_moe build/bench/gpu_profile /tmp/ab/old/`, rebuild, carry both). ROUNDS interleaved rounds
# of: the MoE layer alone (test_cuda_moe's TimingReport, fused_sm90) at each of TOKENS; the experts and total of
# gpu_profile's 16 x 512 prefill step; the overlapped decode step at bs 64 and 128. Then one table of medians.
# A variant may add environment settings after commas (NAME=DIR,VAR=VALUE,...): the same build with a switch.
#   scripts/gpu-moe-binary-ab.sh MODEL_DIR old=/tmp/ab/old new=build ws11=build,MOESERVE_MOE_WS_PREFILL=11
# Env: ROUNDS (default 3), TOKENS (default "8192 2048"), OUT (per-run logs; default a temp dir). Prints a table of
# medians, then every round's value.
set -uo pipefail
MODEL=${1:?usage: gpu-moe-binary-ab.sh MODEL_DIR NAME=DIR...}
shift
[[ -f $MODEL/config.json ]] || { echo "no model at $MODEL (moeserve gen-model --preset q30b8l --output $MODEL)" >&2; exit 2; }
ROUNDS=${ROUNDS:-3}
read -r -a tokens <<<"${TOKENS:-8192 2048}"
LOGS=${OUT:-$(mktemp -d /tmp/moe-binary-ab.XXXXXX)}
mkdir -p "$LOGS"
rm -f "$LOGS"/*.vals  # a reused OUT (the same machine, a later call) must not mix an earlier run's values into the medians
bin() {  # DIR NAME -> the binary's path
  local d=$1 n=$2 sub=tests
  [[ $n == gpu_profile ]] && sub=bench
  if [[ -x $d/$sub/$n ]]; then echo "$d/$sub/$n"; else echo "$d/$n"; fi
}
spec_dir() { local s=${1#*=}; echo "${s%%,*}"; }  # NAME=DIR[,VAR=VALUE...] -> DIR
spec_env() { local s=${1#*=}; [[ $s == *,* ]] && tr ',' ' ' <<<"${s#*,}"; }  # -> "VAR=VALUE ..."
for v in "$@"; do
  for n in test_cuda_moe gpu_profile; do
    [[ -x $(bin "$(spec_dir "$v")" $n) ]] || { echo "variant ${v%%=*}: no $n in $(spec_dir "$v")" >&2; exit 2; }
  done
done
record() { echo "$3" >>"$LOGS/$1.$2.vals"; }  # variant measure value
for ((r = 1; r <= ROUNDS; ++r)); do
  for v in "$@"; do
    name=${v%%=*} dir=$(spec_dir "$v")
    read -r -a envs <<<"$(spec_env "$v")"
    for T in "${tokens[@]}"; do
      us=$(env "${envs[@]}" MOESERVE_TIMING_T=$T timeout 60 "$(bin "$dir" test_cuda_moe)" --gtest_also_run_disabled_tests \
        --gtest_filter='*TimingReport*' 2>&1 | awk -v t="$T" '$0 ~ "T= *"t" fused_sm90" {for (i = 1; i <= NF; ++i) if ($(i + 1) == "us") {print $i; exit}}')
      record "$name" "layer_T$T" "${us:-nan}"
    done
    log=$LOGS/profile_${name}_$r.log  # one model load: the decode steps at bs 64 and 128, then the prefill steps
    env "${envs[@]}" timeout 120 "$(bin "$dir" gpu_profile)" --model-path "$MODEL" --batch-sizes 64,128 >"$log" 2>&1
    record "$name" prefill_experts "$(grep -A14 '16 x 512' "$log" | awk '$1 == "moe" && $2 == "experts" {print $4; exit}')"
    record "$name" prefill_total "$(grep -A14 '16 x 512' "$log" | awk '$1 == "total" {print $2; exit}')"
    mapfile -t over < <(grep 'overlapped decode step' "$log" | grep -oE '[0-9]+\.[0-9]+ us' | cut -d' ' -f1)
    record "$name" step_bs64 "${over[0]:-nan}"
    record "$name" step_bs128 "${over[1]:-nan}"
  done
  echo "round $r done"
done
median() { sort -g "$1" | awk '{a[NR] = $1} END {if (NR == 0) print "-"; else if (NR % 2) print a[(NR + 1) / 2]; else printf "%.1f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
measures=()
for T in "${tokens[@]}"; do measures+=("layer_T$T"); done
measures+=(prefill_experts prefill_total step_bs64 step_bs128)
printf '%-12s' "us (median)"
for m in "${measures[@]}"; do printf ' %16s' "$m"; done
printf '\n'
for v in "$@"; do
  name=${v%%=*}
  printf '%-12s' "$name"
  for m in "${measures[@]}"; do printf ' %16s' "$(median "$LOGS/$name.$m.vals")"; done
  printf '\n'
done
# Every round's value beside the median (a device call brings back only a few of the .vals files): the spread says
# whether a difference between medians is more than the machine's noise.
echo "every value (rounds in order; files: $LOGS/*.vals):"
for v in "$@"; do
  name=${v%%=*}
  for m in "${measures[@]}"; do printf '  %-12s %-16s %s\n' "$name" "$m" "$(tr '\n' ' ' <"$LOGS/$name.$m.vals")"; done
done
