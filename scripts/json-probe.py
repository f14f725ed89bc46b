#!/usr/bin/env python3
# Constrained decoding (JSON schema) through a running server, e.g. a GPU one (the e2e suites need node; this needs
# only Python): greedy, sampled and SGLang-native outputs checked against the schema by an independent validator,
# constrained against plain tokens/s, plain greedy requests beside constrained ones against their solo outputs, and
# logit_bias still applied. Prints "JSON PROBE: PASS" or the failures. Usage: scripts/json-probe.py PORT
import json, sys, time, urllib.request, concurrent.futures as cf

if len(sys.argv) != 2 or not sys.argv[1].isdigit():
    sys.exit("usage: scripts/json-probe.py PORT (a moeserve server on 127.0.0.1:PORT)")
BASE = f"http://127.0.0.1:{sys.argv[1]}"

def post(path, body):
    req = urllib.request.Request(BASE + path, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    t = time.time()
    try:
        r = json.loads(urllib.request.urlopen(req, timeout=300).read())
        code = 200
    except urllib.error.HTTPError as e:
        r, code = json.loads(e.read()), e.code
    return code, r, time.time() - t

def errors(v, s, defs, path="$"):
    if "$ref" in s: return errors(v, defs[s["$ref"].split("/")[-1]], defs, path)
    if "anyOf" in s: return [] if any(not errors(v, a, defs, path) for a in s["anyOf"]) else [f"{path}: no anyOf"]
    if "enum" in s: return [] if any(json.dumps(e) == json.dumps(v) for e in s["enum"]) else [f"{path}: enum"]
    t = {type(None): "null", bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}[type(v)]
    w = s.get("type")
    if w == "integer" and t != "integer": return [f"{path}: {t} not integer"]
    if w == "number" and t not in ("integer", "number"): return [f"{path}: {t} not number"]
    if w and w not in ("integer", "number") and w != t: return [f"{path}: {t} not {w}"]
    e = []
    if t == "string" and "maxLength" in s and len(v) > s["maxLength"]: e.append(f"{path}: too long")
    if t == "array":
        if "maxItems" in s and len(v) > s["maxItems"]: e.append(f"{path}: too many")
        for k, x in enumerate(v): e += errors(x, s.get("items", {}), defs, f"{path}[{k}]")
    if t == "object" and "properties" in s:
        order = list(s["properties"])
        for k in s.get("required", []):
            if k not in v: e.append(f"{path}: {k} missing")
        idx = [order.index(k) if k in order else -1 for k in v]
        if -1 in idx or idx != sorted(idx): e.append(f"{path}: keys {list(v)}")
        for k in v:
            if k in s["properties"]: e += errors(v[k], s["properties"][k], defs, f"{path}.{k}")
    return e

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 10}, "age": {"type": "integer"}, "mood": {"enum": ["happy", "sad", 3, None]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2}, "ok": {"type": "boolean"},
    "pos": {"$ref": "#/$defs/point"}}, "required": ["name", "age", "mood", "tags", "ok", "pos"],
    "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}}}
rf = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
chat = {"messages": [{"role": "user", "content": "Describe a person"}], "max_tokens": 400,
        "chat_template_kwargs": {"enable_thinking": False}, "response_format": rf}
bad = 0
def check(label, code, text, finish):
    global bad
    try:
        v = json.loads(text); errs = errors(v, PERSON, PERSON["$defs"])
    except Exception as ex:
        errs = [f"not JSON: {ex}"]
    ok = code == 200 and finish == "stop" and not errs
    bad += not ok
    print(f"{'ok ' if ok else 'BAD'} {label}: finish {finish}, {len(text)} chars {errs[:2]} {text[:80]!r}")

post("/v1/chat/completions", {**chat, "temperature": 0})  # the first constrained request also builds the vocabulary's trie
code, r, dt = post("/v1/chat/completions", {**chat, "temperature": 0})
check("greedy chat", code, r["choices"][0]["message"]["content"], r["choices"][0]["finish_reason"])
toks = r["usage"]["completion_tokens"]
print(f"    constrained greedy: {toks} tokens in {dt:.2f} s = {toks / dt:.0f} tok/s")
code, p, dtp = post("/v1/completions", {"prompt": "Describe a person", "max_tokens": toks, "temperature": 0, "ignore_eos": True})
print(f"    plain greedy:       {p['usage']['completion_tokens']} tokens in {dtp:.2f} s = {p['usage']['completion_tokens'] / dtp:.0f} tok/s")
qs = {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "seed": 3}  # Qwen3's default chat sampling
code, r, dt = post("/v1/chat/completions", {**chat, **qs})
check("sampled chat (Qwen3 defaults)", code, r["choices"][0]["message"]["content"], r["choices"][0]["finish_reason"])
toks = r["usage"]["completion_tokens"]
code, p, dtp = post("/v1/completions", {"prompt": "Describe a person", "max_tokens": toks, "ignore_eos": True, **qs})
print(f"    constrained sampled: {toks / dt:.0f} tok/s; plain sampled: {p['usage']['completion_tokens'] / dtp:.0f} tok/s "
      f"({toks} tokens, temperature 0.6, top_k 20, top_p 0.95)")
# Batched: 16 constrained greedy requests at a time, 64 in all (their rows' masks computed side by side while the
# forward runs), against 64 plain ones of the same lengths, 16 at a time.
N, M = 16, 64
def batch(bodies):
    with cf.ThreadPoolExecutor(N) as ex:
        t = time.time()
        rs = list(ex.map(lambda b: post(*b), bodies))
        return rs, time.time() - t
rs, dt = batch([("/v1/chat/completions", {**chat, "temperature": 0, "messages": [{"role": "user", "content": f"Describe person {k}"}]})
                for k in range(M)])
lens = [r["usage"]["completion_tokens"] for _, r, _ in rs]
for k, (code, r, _) in enumerate(rs[:4]):
    check(f"batched constrained {k}", code, r["choices"][0]["message"]["content"], r["choices"][0]["finish_reason"])
ps, dtp = batch([("/v1/completions", {"prompt": f"Describe person {k}", "max_tokens": lens[k], "temperature": 0, "ignore_eos": True})
                 for k in range(M)])
print(f"    {M} constrained greedy requests, {N} at a time: {sum(lens)} tokens in {dt:.2f} s = {sum(lens) / dt:.0f} tok/s; "
      f"plain: {sum(r['usage']['completion_tokens'] for _, r, _ in ps) / dtp:.0f} tok/s")
code, r, dt = post("/v1/chat/completions", {**chat, "temperature": 1.0, "n": 4, "seed": 5})
for c in r["choices"]: check(f"sampled chat {c['index']}", code, c["message"]["content"], c["finish_reason"])
code, r, dt = post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 400, "temperature": 0.7, "json_schema": json.dumps(PERSON)}})
check("/generate json_schema", code, r.get("text", ""), r.get("meta_info", {}).get("finish_reason", {}).get("type"))
# Plain greedy requests alone, then beside constrained ones (the batch leaves the graphs and the overlap schedule).
ids = [[785, 3974, 13876 + i, 38835, 34208] for i in range(8)]
gen = lambda i: post("/generate", {"input_ids": ids[i], "sampling_params": {"max_new_tokens": 32, "temperature": 0, "ignore_eos": True}})
solo = [gen(i)[1]["output_ids"] for i in range(8)]
with cf.ThreadPoolExecutor(12) as ex:
    cons = [ex.submit(post, "/v1/chat/completions", {**chat, "temperature": 0}) for _ in range(3)]
    plain = [ex.submit(gen, i) for i in range(8)]
    same = sum(f.result()[1]["output_ids"] == solo[i] for i, f in enumerate(plain))
    for k, f in enumerate(cons):
        code, r, _ = f.result()
        check(f"concurrent constrained {k}", code, r["choices"][0]["message"]["content"], r["choices"][0]["finish_reason"])
print(f"    plain requests beside constrained ones: {same}/8 equal to their solo greedy output (bf16 batches may flip near-ties)")
code, r, _ = post("/v1/completions", {"prompt": "x", "max_tokens": 8, "temperature": 0, "logit_bias": {"1234": 100}})
lb = r["choices"][0]["text"] if code == 200 else r
print(f"    logit_bias +100 on token 1234: {lb!r}")
print("JSON PROBE:", "PASS" if bad == 0 else f"{bad} BAD")
