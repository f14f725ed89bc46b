#!/usr/bin/env python3
"""Summarises a scheduler step trace (MOESERVE_STEP_TRACE=file on `moeserve serve`).

Each CSV line is one collected step: when its launch began, how long the launch took on the host (launch_ms; absent
in traces before it was added), when it was collected (host seconds), its decodes, prompt tokens and prompt
sequences, the rows it sampled, and the running / waiting counts. A launch longer than the step before it leaves the
device idle (host-bound). A step's device time is taken as the time
from the later of its launch and the previous step's collection to its own collection (the overlap schedule keeps up
to two steps in flight). Runs separated by an idle gap (default 0.25 s) are reported apart, e.g. the scenarios of one
gpu-bench server.

  tools/step_trace_summary.py steps.csv [--gap 0.25] [--steps | --brief | --waves]

--waves splits each run where prompt steps start again after a stretch of decode-only steps (the waves of a
closed-loop benchmark such as 64 concurrent requests) and prints one line a wave: its length, its prompt / mixed
steps and their time, its decode-only steps and their time, and its sampled tokens a second.

--brief prints one line a run (steps, length, the longest host launch, host-bound launches): what scripts/gpu-bench.sh
shows after each model, so that a launch that blocks (e.g. a library kernel's first launch, session 19) is visible.
"""
import argparse
import csv
import collections
import sys


def load(path):
    with open(path) as f:
        rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]
    prev = None
    for r in rows:
        start = r["launched_s"] if prev is None else max(r["launched_s"], prev)
        r["device_s"] = r["collected_s"] - start
        prev = r["collected_s"]
    return rows


def split_runs(rows, gap):
    runs = []
    for r in rows:
        if not runs or r["launched_s"] - runs[-1][-1]["collected_s"] > gap:
            runs.append([])
        runs[-1].append(r)
    return runs


def kind(r):
    if r["prompt_tokens"] > 0:
        return "prompt" if r["decodes"] == 0 else "mixed"
    return "decode"


def summarise(run, index, out):
    span = run[-1]["collected_s"] - run[0]["launched_s"]
    decodes = sum(r["decodes"] for r in run)
    prompt = sum(r["prompt_tokens"] for r in run)
    out.write(f"run {index}: {len(run)} steps in {span * 1e3:.1f} ms, {decodes:.0f} decodes, {prompt:.0f} prompt tokens, "
              f"{sum(r['sampled'] for r in run):.0f} samples\n")
    groups = collections.defaultdict(list)
    for r in run:
        groups[kind(r)].append(r)
    for k in ("decode", "mixed", "prompt"):
        g = groups.get(k)
        if not g:
            continue
        t = sorted(r["device_s"] for r in g)
        out.write(f"  {k:<7} {len(g):5d} steps, {sum(t) * 1e3:9.1f} ms, median {t[len(t) // 2] * 1e3:7.2f} ms, "
                  f"max {t[-1] * 1e3:7.2f} ms, decodes a step {sum(r['decodes'] for r in g) / len(g):6.1f}, "
                  f"prompt tokens a step {sum(r['prompt_tokens'] for r in g) / len(g):7.0f}\n")
        if "launch_ms" in g[0]:
            lt = sorted(r["launch_ms"] for r in g)
            out.write(f"          host launch median {lt[len(lt) // 2]:6.2f} ms, max {lt[-1]:6.2f} ms\n")
    if "launch_ms" in run[0]:
        # A launch that outlasts the step before it (the overlap schedule launches n + 1 while n runs).
        slow = [b for a, b in zip(run, run[1:]) if b["launch_ms"] * 1e-3 > a["device_s"]]
        if slow:
            out.write(f"  host-bound launches: {len(slow)} (longer than the step before them), "
                      f"{sum(r['launch_ms'] for r in slow):.1f} ms of launch in all\n")
    # Decode steps by batch size: a partial batch costs nearly a full one when the step is weight-bound.
    sizes = collections.Counter(int(r["decodes"]) for r in groups.get("decode", []))
    if sizes:
        top = ", ".join(f"{b}: {n}" for b, n in sorted(sizes.items(), key=lambda x: -x[1])[:8])
        out.write(f"  decode steps by batch size (most frequent first): {top}\n")


def brief(run, index, out):
    span = run[-1]["collected_s"] - run[0]["launched_s"]
    line = f"run {index}: {len(run)} steps in {span * 1e3:.1f} ms"
    if "launch_ms" in run[0]:
        slow = [b for a, b in zip(run, run[1:]) if b["launch_ms"] * 1e-3 > a["device_s"]]
        line += (f", longest host launch {max(r['launch_ms'] for r in run):.2f} ms, host-bound launches {len(slow)} "
                 f"({sum(r['launch_ms'] for r in slow):.1f} ms)")
    out.write(line + "\n")


def waves(run, index, out, min_decode_steps=8):
    """One line a wave: a wave starts at a step with prompt tokens after at least min_decode_steps decode-only
    steps (or at the run's start) and ends where the next one starts."""
    starts, plain = [0], 0
    for i, r in enumerate(run):
        if kind(r) == "decode":
            plain += 1
        else:
            if plain >= min_decode_steps and i > 0:
                starts.append(i)
            plain = 0
    starts.append(len(run))
    out.write(f"run {index}: {len(starts) - 1} waves\n")
    for w, (a, b) in enumerate(zip(starts, starts[1:])):
        seg = run[a:b]
        # A wave's time: from the end of the step before it (or its own launch) to its last collection.
        t0 = run[a - 1]["collected_s"] if a > 0 else seg[0]["launched_s"]
        span = seg[-1]["collected_s"] - t0
        pm = [r for r in seg if kind(r) != "decode"]
        dec = [r for r in seg if kind(r) == "decode"]
        full = max((int(r["decodes"]) for r in dec), default=0)
        out.write(f"  wave {w}: {span * 1e3:7.1f} ms, {sum(r['sampled'] for r in seg) / span if span > 0 else 0:8.0f} "
                  f"tok/s; prompt/mixed {len(pm):2d} steps {sum(r['device_s'] for r in pm) * 1e3:6.1f} ms "
                  f"({sum(r['prompt_tokens'] for r in pm):.0f} prompt tokens, {sum(r['decodes'] for r in pm):.0f} "
                  f"decodes); decode {len(dec):3d} steps {sum(r['device_s'] for r in dec) * 1e3:6.1f} ms "
                  f"({sum(1 for r in dec if int(r['decodes']) == full)} of {full})\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--gap", type=float, default=0.25, help="idle seconds that separate two runs")
    ap.add_argument("--steps", action="store_true", help="also list every non-decode step and partial decode batch")
    ap.add_argument("--brief", action="store_true", help="one line a run")
    ap.add_argument("--waves", action="store_true", help="one line a wave of a closed-loop benchmark")
    a = ap.parse_args()
    rows = load(a.trace)
    if not rows:
        sys.exit(f"{a.trace}: no steps")
    for i, run in enumerate(split_runs(rows, a.gap)):
        if a.brief:
            brief(run, i, sys.stdout)
            continue
        if a.waves:
            waves(run, i, sys.stdout)
            continue
        summarise(run, i, sys.stdout)
        if a.steps:
            full = max(int(r["decodes"]) for r in run)
            t0 = run[0]["launched_s"]
            for r in run:
                if kind(r) != "decode" or int(r["decodes"]) < full:
                    print(f"    t {1e3 * (r['launched_s'] - t0):9.2f} ms  {kind(r):<7} decodes {r['decodes']:4.0f}  "
                          f"prompt {r['prompt_tokens']:6.0f} in {r['prompt_seqs']:3.0f} seqs  "
                          f"device {1e3 * r['device_s']:6.2f} ms  running {r['running']:4.0f}  waiting {r['waiting']:4.0f}")


if __name__ == "__main__":
    main()
