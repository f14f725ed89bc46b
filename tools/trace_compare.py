#!/usr/bin/env python3
"""Side by side: the per-kernel summaries of two `gpu_profile --trace` logs (an A/B of one step's timeline).

    tools/trace_compare.py A.log B.log [--names a,b]

For every traced step of both logs (the "== decode, batch N ..." / "== mixed ..." sections), one row a kernel name:
its count and summed chain time in A and in B and the difference B - A, largest differences first, then the step
spans. A kernel only one side launches shows "-" on the other (a fusion's removed launches sum with the new one's).
"""
import argparse
import re
import sys

HEADER = re.compile(r"^== (.*?)(?::.*)? ==$")
ROW = re.compile(r"^(\S+)\s+(\d+)\s+([0-9.]+)$")
SPAN = re.compile(r"^step span .*?: ([0-9.]+) us")


def parse(path):
    """{section: {"kernels": {name: (count, chain_us)}, "span": us}} in file order."""
    sections, current, in_table = {}, None, False
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            m = HEADER.match(line)
            if m:
                current = sections.setdefault(m.group(1), {"kernels": {}, "span": None})
                in_table = False
                continue
            if current is None:
                continue
            m = SPAN.match(line)
            if m:
                current["span"] = float(m.group(1))
                continue
            if line.startswith("kernel ") and "count" in line:
                in_table = True
                continue
            if in_table:
                m = ROW.match(line)
                if m:
                    current["kernels"][m.group(1)] = (int(m.group(2)), float(m.group(3)))
                else:
                    in_table = False
    return sections


def compare(a, b, names):
    out = []
    for section in [s for s in a if s in b]:
        ka, kb = a[section]["kernels"], b[section]["kernels"]
        out.append(f"== {section}: {names[0]} vs {names[1]} (chain us summed over the step)")
        out.append(f"{'kernel':42} {names[0] + ' n':>8} {names[0]:>10} {names[1] + ' n':>8} {names[1]:>10} {'diff':>9}")
        rows = []
        for k in set(ka) | set(kb):
            ca, ta = ka.get(k, (None, None))
            cb, tb = kb.get(k, (None, None))
            diff = (tb or 0.0) - (ta or 0.0)
            rows.append((abs(diff), k, ca, ta, cb, tb, diff))
        for _, k, ca, ta, cb, tb, diff in sorted(rows, reverse=True):
            fmt = lambda v, spec: "-" if v is None else format(v, spec)
            out.append(f"{k[:42]:42} {fmt(ca, 'd'):>8} {fmt(ta, '.1f'):>10} {fmt(cb, 'd'):>8} {fmt(tb, '.1f'):>10} "
                       f"{diff:+9.1f}")
        sa, sb = a[section]["span"], b[section]["span"]
        if sa is not None and sb is not None:
            out.append(f"{'step span':42} {'':>8} {sa:10.1f} {'':>8} {sb:10.1f} {sb - sa:+9.1f}")
        out.append("")
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--names", default="A,B", help="column names of the two logs, comma-separated")
    args = p.parse_args()
    names = args.names.split(",")
    if len(names) != 2:
        sys.exit("--names: two names, comma-separated")
    a, b = parse(args.a), parse(args.b)
    text = compare(a, b, names)
    if not text:
        sys.exit("no traced step common to both logs (gpu_profile --trace output expected)")
    print(text)


if __name__ == "__main__":
    main()
