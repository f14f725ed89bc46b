#!/usr/bin/env bash
# What prompt logprobs cost: N completions of LEN-token token-id prompts, CONC at a time, max_tokens 0, first as plain
# prefill, then with echo + logprobs 1 (lm-eval's loglikelihood requests), each run on a flushed prefix cache with its
# own prompts, ROUNDS rounds; prints prompt tokens/s for each. Starts its own server on MODEL_DIR (any flags after it go
# to `moeserve serve`).
#   scripts/bench-prompt-logprobs.sh MODEL_DIR [SERVE FLAGS...]
# Env: N (default 128), CONC (64), LEN (512), ROUNDS (2), PORT (30112), MOESERVE_BUILD (default build).
# docs/PERF.md: H100, q30b8l, 440 k against 40.5 k prompt tok/s in session 52 (a step scored at most 160 positions),
# 435 k against 231 k in session 53 (the lm_head in slices of 256 rows, score_forced_rows).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${MOESERVE_BUILD:-$ROOT/build}
MODEL=${1:?usage: bench-prompt-logprobs.sh MODEL_DIR [SERVE FLAGS...]}
shift
PORT=${PORT:-30112}
LOG=$(mktemp /tmp/bench-prompt-logprobs.XXXXXX.log)
"$BUILD/bin/moeserve" serve --model-path "$MODEL" --port "$PORT" "$@" >"$LOG" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
  curl -sf "localhost:$PORT/health" >/dev/null && break
  kill -0 $pid 2>/dev/null || { echo "the server exited; its log: $LOG" >&2; exit 1; }
  sleep 1
done
PORT=$PORT N=${N:-128} CONC=${CONC:-64} LEN=${LEN:-512} ROUNDS=${ROUNDS:-2} python3 - <<'PY'
import json, os, time, urllib.request
from concurrent.futures import ThreadPoolExecutor
base = "http://127.0.0.1:%s" % os.environ["PORT"]
n, conc, L, rounds = (int(os.environ[k]) for k in ("N", "CONC", "LEN", "ROUNDS"))
def post(path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=600))
def run(scored, salt):
    urllib.request.urlopen(urllib.request.Request(base + "/flush_cache", data=b"", method="POST"), timeout=60)
    prompts = [[(i * 7919 + k * 104729 + salt * 31) % 150000 + 10 for k in range(L)] for i in range(n)]
    extra = {"echo": True, "logprobs": 1} if scored else {}
    t0 = time.time()
    with ThreadPoolExecutor(conc) as ex:
        res = list(ex.map(lambda p: post("/v1/completions", dict(prompt=p, max_tokens=0, temperature=0, **extra)), prompts))
    dt = time.time() - t0
    if scored:
        assert all(len(r["choices"][0]["logprobs"]["token_logprobs"]) == L for r in res), "a prompt's logprobs are missing"
    return n * L / dt, dt
for rnd in range(rounds):
    for scored in (False, True):
        tps, dt = run(scored, 2 * rnd + int(scored))
        print("%-22s %9.0f prompt tok/s  (%.2f s)" % ("echo + logprobs 1" if scored else "prefill only", tps, dt))
PY
