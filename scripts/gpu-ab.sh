#!/usr/bin/env bash
# A/B of engine variants on the GPU machine in one call: for each variant (environment settings and gpu_profile
# flags), the served decode step at batch 1, 64 and 128 (graph replay + sampling + copies, host-timed) from
# build/bench/gpu_profile, one row a variant, plus the full per-op report of each in gpu-ab-logs.tgz. Each cell is
# "served / overlapped": one step launched and collected at a time, then the overlap schedule's regime (the next
# step launched before the last is collected), which is what a server's decode runs at.
#   scripts/gpu-ab.sh MODEL_DIR 'base=' 'nopdl=MOESERVE_PDL=0' 'gemv=--gemm-backend gemv' ...
# A variant is NAME=WORDS: `build=DIR` runs that variant's gpu_profile from DIR (DIR/bench/ or DIR/: a baseline packed
# with `scripts/pack-for-gpu.sh --baseline` or scripts/build-ab-binaries.sh, e.g. build=build-base, or a folder the
# binaries were copied to), other words with '=' are environment settings, the rest
# gpu_profile flags. Alternate the variants (a= b= a2= b2=): machines drift within a call.
# Env: OUT (where gpu-ab-logs.tgz goes, scripts/lib/archive.sh), MOESERVE_BUILD (default build), AB_FLAGS (gpu_profile flags for every variant,
# e.g. "--batch-sizes 1,64 --prefill=false": the columns then follow those batch sizes).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${MOESERVE_BUILD:-$ROOT/build}
source "$ROOT/scripts/lib/ensure-built.sh"
ensure_built "$BUILD" bench/gpu_profile
MODEL=${1:?usage: gpu-ab.sh MODEL_DIR NAME=SETTINGS...}
shift
LOGS=$(mktemp -d /tmp/gpu-ab.XXXXXX)
# Column headers: the batch sizes of AB_FLAGS' --batch-sizes (gpu_profile's default: 1,64,128).
sizes=$(sed -nE 's/.*--batch-sizes[= ]([0-9,]+).*/\1/p' <<<"${AB_FLAGS:-}")
IFS=, read -r -a bs <<<"${sizes:-1,64,128}"
printf '%-14s' variant
for b in "${bs[@]}"; do printf ' %18s' "bs$b us"; done
printf '  backends (gemm / moe, as auto chose them)\n'
# The backend auto chose for family $1 in log $2: a switch that slows one backend's timed trial can make auto pick
# another for every op of the family (session 42: a gemv-backend experiment silently ran on cuBLASLt).
chosen() { sed -nE "s/.*backend $1 ([a-z0-9_]+): .*/\1/p" "$2" | head -1; }
for v in "$@"; do
  name=${v%%=*}
  words=${v#*=}
  envs=()
  flags=(${AB_FLAGS:-})  # AB_FLAGS: gpu_profile flags for every variant
  vbuild=$BUILD
  for w in $words; do
    if [[ $w == build=* ]]; then vbuild=${w#build=}
    elif [[ $w == *=* && $w != --* ]]; then envs+=("$w")
    else flags+=("$w"); fi
  done
  prof=$vbuild/bench/gpu_profile  # a build's layout, or a folder the binaries were copied to
  [[ -x $prof ]] || prof=$vbuild/gpu_profile
  if [[ ! -x $prof ]]; then
    printf '%-14s no gpu_profile in %s or %s/bench\n' "$name" "$vbuild" "$vbuild"
    continue
  fi
  env "${envs[@]}" "$prof" --model-path "$MODEL" "${flags[@]}" >"$LOGS/$name.log" 2>&1
  mapfile -t served < <(grep 'served decode step' "$LOGS/$name.log" | grep -oE '[0-9]+\.[0-9]+ us' | cut -d' ' -f1)
  mapfile -t over < <(grep 'overlapped decode step' "$LOGS/$name.log" | grep -oE '[0-9]+\.[0-9]+ us' | cut -d' ' -f1)
  cell() { echo "${served[$1]:-fail} / ${over[$1]:-fail}"; }
  printf '%-14s' "$name"
  for i in "${!bs[@]}"; do printf ' %18s' "$(cell "$i")"; done
  printf '  %s / %s\n' "$(chosen gemm "$LOGS/$name.log")" "$(chosen moe "$LOGS/$name.log")"
done
source "$ROOT/scripts/lib/archive.sh"
archive=$(log_archive gpu-ab)
tar czf "$archive" -C "$LOGS" . && echo "logs: $archive"
