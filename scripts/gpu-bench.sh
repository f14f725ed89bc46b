#!/usr/bin/env bash
# The serving benchmark on the GPU machine, in one run: makes the benchmark models with `moeserve gen-model`
# on local disk, starts the server on each, measures start to /health 200, runs `moeserve bench` for
# 1 request (512 in / 128 out), 64 and 128 concurrent (512 / 128) and prefill-heavy (512 in / 1 out), and
# prints one table with SPEC.md's targets beside the figures.
# Env: MODELS (default "q30b8l"; "q30b8l q30b" for both: q30b needs ~57 GiB of disk, so the q30b8l copy is removed
# first and q30b is removed after its run, unless KEEP_Q30B=1: on the 64 GiB GPU machine nothing else that writes
# to disk fits beside it), BENCH_DIR (models; default /tmp/moeserve-bench), SERVE_ARGS (extra serve flags),
# SCENARIOS (default "decode1 conc64 conc128 prefill": a subset for quick A/B; "conc8", 8 concurrent, and "conc64-1k",
# 64 concurrent over 1,024 prompts instead of 256 - 16 waves, so the ramp (64 prompts at once) and the drain weigh a
# quarter as much: the steady state that SGLang's and vLLM's serving benchmarks, 1,000 prompts by default, report -
# only when named),
# BENCH_ARGS (extra `moeserve bench` flags, e.g. "--temperature 0.6": sampled requests, which take the checkpoint's
# top_k / top_p), OUT (where the logs go: gpu-bench-logs.tgz, scripts/lib/archive.sh),
# STEP_TRACE (default 1: each server writes a step trace, MOESERVE_STEP_TRACE, unless the caller set that, and the
# table is followed by one line a scenario run from tools/step_trace_summary.py --brief; 0: no trace), GPU_SAMPLE
# (default 1: nvidia-smi samples the SM clock and the power draw every 20 ms through each scenario, and one line a
# scenario gives their spread over the busy samples - the prompt steps of a long prompt run at the 700 W limit and
# throttle, session 37; 0: off).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${MOESERVE_BUILD:-$ROOT/build}
source "$ROOT/scripts/lib/ensure-built.sh"
ensure_built "$BUILD" bin/moeserve
BIN=$BUILD/bin/moeserve
LOGS=$(mktemp -d /tmp/gpu-bench.XXXXXX)  # every log; OUT gets them as one archive
source "$ROOT/scripts/lib/archive.sh"
ARCHIVE=$(log_archive gpu-bench)
DIR=${BENCH_DIR:-/tmp/moeserve-bench}
MODELS=${MODELS:-q30b8l}
PORT=${PORT:-30123}
mkdir -p "$LOGS" "$DIR"
export MOESERVE_CACHE=${MOESERVE_CACHE:-/tmp/moeserve-cache}
rows=()
smi_pid=""

# The GPU's SM clock and power draw through a scenario (GPU_SAMPLE): power.draw.instant where the driver has it (the
# plain power.draw is a one-second average, too slow for steps of milliseconds).
smi_fields=""
if [[ ${GPU_SAMPLE:-1} != 0 ]] && command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=serial,name,clocks.max.sm,power.limit --format=csv,noheader >"$LOGS/gpu.txt" 2>&1
  for f in power.draw.instant power.draw; do
    if nvidia-smi --query-gpu="$f" --format=csv,noheader >/dev/null 2>&1; then smi_fields="clocks.sm,$f,utilization.gpu"; break; fi
  done
fi
sample_start() {  # model scenario
  [[ -n $smi_fields ]] || return 0
  nvidia-smi --query-gpu="$smi_fields" --format=csv,noheader,nounits -lms 20 >"$LOGS/smi-$1-$2.csv" 2>/dev/null &
  smi_pid=$!
}
sample_stop() {  # model scenario
  [[ -n $smi_pid ]] || return 0
  kill "$smi_pid" 2>/dev/null; wait "$smi_pid" 2>/dev/null; smi_pid=""
  python3 "$ROOT/tools/gpu_samples.py" "$LOGS/smi-$1-$2.csv" "$1" "$2" >>"$LOGS/gpu-samples.txt" 2>&1
}

target() {  # model scenario -> target figure
  case "$1/$2" in
    q30b8l/decode1) echo 1900 ;; q30b/decode1) echo 450 ;;
    q30b8l/conc64) echo 20000 ;; q30b8l/conc64-1k) echo "20000 (steady state)" ;; q30b8l/conc128) echo 28000 ;;
    q30b8l/prefill) echo 60000 ;; */startup) echo "<20 s" ;; *) echo "-" ;;
  esac
}

engine_times() {  # steps, step s, forward s, deliver s, overlapped steps from /metrics
  local m
  m=$(curl -s "http://127.0.0.1:$PORT/metrics")
  for k in steps step_seconds forward_seconds deliver_seconds overlapped_steps; do
    awk -v k="moeserve_engine_${k}_total" '$1 == k {printf "%s ", $2}' <<<"$m"
  done
}

bench() {  # model name num_prompts concurrency in out field
  local m=$1 name=$2 n=$3 c=$4 in=$5 out=$6 field=$7
  [[ " ${SCENARIOS:-decode1 conc64 conc128 prefill} " == *" $name "* ]] || return 0
  rm -f "$LOGS/$m-$name.json"
  local before
  before=$(engine_times)
  sample_start "$m" "$name"
  "$BIN" bench --port "$PORT" --dataset-name random-ids --num-prompts "$n" --max-concurrency "$c" \
    --random-input-len "$in" --random-output-len "$out" --random-range-ratio 1 --warmup-requests 2 \
    --flush-cache --disable-tqdm --output-file "$LOGS/$m-$name.json" ${BENCH_ARGS:-} >"$LOGS/$m-$name.log" 2>&1
  sample_stop "$m" "$name"
  local v
  v=$(python3 -c "import json,sys; d=json.loads(open(sys.argv[1]).readline()); print(f\"{d['$field']:.0f} tok/s  (TTFT p50 {d.get('median_ttft_ms',0):.1f} ms, TPOT p50 {d.get('median_tpot_ms',0):.2f} ms, ok {d.get('completed',0)})\")" "$LOGS/$m-$name.json" 2>/dev/null || echo "failed (see $m-$name.log)")
  rows+=("$(printf '%-8s %-9s %-62s %s' "$m" "$name" "$v" "$(target "$m" "$name")")")
  # Where the engine thread's time went during the run (includes the warm-up requests).
  python3 - "$before" "$(engine_times)" "$m" "$name" >>"$LOGS/engine-times.txt" <<'PY'
import sys
a = [float(x) for x in sys.argv[1].split()]; b = [float(x) for x in sys.argv[2].split()]
steps, step, fwd, dlv, ovl = (y - x for x, y in zip(a, b))
if steps > 0 and step > 0:
    print(f"{sys.argv[3]:<8} {sys.argv[4]:<9} {steps:.0f} steps ({ovl:.0f} overlapped), {1e3*step/steps:.2f} ms/step "
          f"on the engine thread (forward + sampling {1e3*fwd/steps:.2f} ms, scheduling {1e3*(step-fwd)/steps:.2f} ms); "
          f"delivery thread {1e3*dlv/steps:.2f} ms/step")
PY
}

for m in $MODELS; do
  path=$DIR/$m
  if [[ ! -f $path/config.json ]]; then
    [[ $m == q30b ]] && rm -rf "$DIR/q30b8l"  # the disk holds one of them at a time
    t0=$(date +%s%N)
    "$BIN" gen-model --preset "$m" --output "$path" >"$LOGS/gen-$m.log" 2>&1 || { echo "gen-model $m failed"; tail "$LOGS/gen-$m.log"; continue; }
    echo "gen-model $m: $(( ($(date +%s%N) - t0) / 1000000 )) ms, $(du -sh "$path" | cut -f1)"
  fi
  cat "$path"/*.safetensors >/dev/null  # from page cache, as the target says
  t0=$(date +%s%N)
  trace=${MOESERVE_STEP_TRACE:-}
  [[ -z $trace && ${STEP_TRACE:-1} != 0 ]] && trace=$LOGS/steps-$m.csv
  MOESERVE_STEP_TRACE=$trace "$BIN" serve --model-path "$path" --port "$PORT" --log-level info ${SERVE_ARGS:-} \
    >"$LOGS/serve-$m.log" 2>&1 &
  pid=$!
  until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do
    if ! kill -0 $pid 2>/dev/null; then echo "server on $m exited:"; tail -20 "$LOGS/serve-$m.log"; break; fi
    sleep 0.2
  done
  kill -0 $pid 2>/dev/null || continue
  st=$(( ($(date +%s%N) - t0) / 1000000 ))
  rows+=("$(printf '%-8s %-9s %-62s %s' "$m" startup "$st ms to /health 200" "$(target "$m" startup)")")
  bench "$m" decode1 8 1 512 128 output_throughput
  bench "$m" conc8 64 8 512 128 output_throughput  # not a target: only when SCENARIOS names it
  if [[ $m == q30b8l ]]; then
    bench "$m" conc64 256 64 512 128 output_throughput
    bench "$m" conc64-1k 1024 64 512 128 output_throughput  # only when SCENARIOS names it
    bench "$m" conc128 512 128 512 128 output_throughput
    bench "$m" prefill 512 128 512 1 input_throughput
  fi
  grep -E 'backend |KV cache|CUDA graphs|weights:|GPU ready' "$LOGS/serve-$m.log" | cut -c1-220
  kill $pid; wait $pid 2>/dev/null
  if [[ -n $trace && -s $trace ]]; then  # run 0 is the server's own warm-up request; then the scenarios in order
    echo "$m step trace ($trace):" >>"$LOGS/step-traces.txt"
    python3 "$ROOT/tools/step_trace_summary.py" --brief "$trace" >>"$LOGS/step-traces.txt" 2>&1
    python3 "$ROOT/tools/step_trace_summary.py" --waves "$trace" >>"$LOGS/step-waves.txt" 2>&1  # in the archive
  fi
  [[ $m == q30b && ${KEEP_Q30B:-0} != 1 ]] && rm -rf "$path"  # the disk back for whatever follows in this call
done
tar czf "$ARCHIVE" -C "$LOGS" . 2>/dev/null && echo "logs: $ARCHIVE"
echo
cat "$LOGS/gpu.txt" 2>/dev/null
cat "$LOGS/engine-times.txt" 2>/dev/null
cat "$LOGS/gpu-samples.txt" 2>/dev/null
cat "$LOGS/step-traces.txt" 2>/dev/null
printf '%-8s %-9s %-62s %s\n' model scenario measured target
printf '%s\n' "${rows[@]}"
