#!/usr/bin/env python3
"""Writes fuzz/seeds/tokenizer_json/*.json: small tokenizer.json files for the tokenizer_json fuzz target.

Each one keeps the components (normalizer, pre-tokenizer, post-processor, decoder, model flags) of one of the
synthetic tokenizers in tests/data/tokenizer/synthetic/, or a hand-made variant, with the vocabulary cut down to
a few hundred tokens and the merges to those among them, so that libFuzzer can mutate them quickly.
Run from the repository root: python3 fuzz/make_tokenizer_json_seeds.py
"""
import copy
import json
import os

SYN = "tests/data/tokenizer/synthetic"
OUT = "fuzz/seeds/tokenizer_json"


def cut(tok, keep_ids, max_merges):
    t = copy.deepcopy(tok)
    m = t["model"]
    vocab = {k: v for k, v in m["vocab"].items() if v < keep_ids}
    merges = []
    for mg in m["merges"]:
        a, b = mg if isinstance(mg, list) else mg.split(" ", 1)
        if a in vocab and b in vocab and (a + b) in vocab:
            merges.append(mg)
        if len(merges) >= max_merges:
            break
    m["vocab"] = vocab
    m["merges"] = merges
    # The loader gives added tokens their ids itself; keep the file's ids consistent with the cut vocabulary.
    next_id = keep_ids
    for a in t.get("added_tokens") or []:
        if a["content"] in vocab:
            a["id"] = vocab[a["content"]]
        else:
            a["id"] = next_id
            next_id += 1
    t["added_tokens"] = (t.get("added_tokens") or [])[:8]
    if t.get("post_processor") and t["post_processor"].get("type") == "TemplateProcessing":
        for name, st in t["post_processor"].get("special_tokens", {}).items():
            ids = [a["id"] for a in t["added_tokens"] if a["content"] == name]
            if ids:
                st["ids"] = ids
    return t


def write(name, t):
    with open(os.path.join(OUT, name + ".json"), "w", encoding="utf-8") as f:
        json.dump(t, f, ensure_ascii=False, separators=(",", ":"))


def main():
    os.makedirs(OUT, exist_ok=True)
    syn = {d: json.load(open(os.path.join(SYN, d, "tokenizer.json"), encoding="utf-8")) for d in sorted(os.listdir(SYN))}
    write("qwen3_flags", cut(syn["qwen3_flags"], 300, 60))
    write("llama2_metaspace", cut(syn["llama2_metaspace"], 300, 80))
    write("llama2_metaspace_always", cut(syn["llama2_metaspace_always"], 200, 60))
    write("misc", cut(syn["misc"], 200, 60))

    # Hand-made: every decoder step, Prepend/Replace/NFKD normalizers, CharDelimiterSplit, Bert post-processor.
    base = cut(syn["llama2_metaspace"], 120, 30)
    t = copy.deepcopy(base)
    t["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"}, {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        {"type": "NFKD"}]}
    t["pre_tokenizer"] = {"type": "CharDelimiterSplit", "delimiter": "x"}
    t["post_processor"] = {"type": "BertProcessing", "sep": ["</s>", 2], "cls": ["<s>", 1]}
    t["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"Regex": "\u2581+"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 2, "stop": 1},
        {"type": "Metaspace", "replacement": "_", "prepend_scheme": "always", "split": True}]}
    t["model"]["continuing_subword_prefix"] = "##"
    t["model"]["end_of_word_suffix"] = "</w>"
    write("handmade_decoders", t)

    # Tiny byte-level tokenizer with every added-token flag and a Sequence post-processor.
    t = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [
            {"id": 9, "content": "<|end|>", "special": True, "lstrip": False, "rstrip": False, "single_word": False, "normalized": False},
            {"id": 10, "content": "[L]", "special": True, "lstrip": True, "rstrip": False, "single_word": False, "normalized": False},
            {"id": 11, "content": "[R]", "special": False, "lstrip": False, "rstrip": True, "single_word": False, "normalized": True},
            {"id": 12, "content": "ab", "special": False, "lstrip": False, "rstrip": False, "single_word": True, "normalized": True},
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": False},
            {"type": "Split", "pattern": {"Regex": " ?\\p{L}+| ?\\p{N}+|\\s+(?!\\S)|\\s+|."}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<|end|>", "type_id": 0}}],
             "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {"<|end|>": {"id": "<|end|>", "ids": [9], "tokens": ["<|end|>"]}}}]},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": {"a": 0, "b": 1, "\u0120": 2, "\u0120a": 3, "ab": 4, "\u0120ab": 5, "1": 6, "\u00c3": 7, "\u00a9": 8},
                  "merges": [["\u0120", "a"], "a b", "\u0120a b"]},
    }
    write("tiny_bytelevel", t)


if __name__ == "__main__":
    main()
