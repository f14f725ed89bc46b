#!/usr/bin/env python3
"""Where a warp-specialized kernel's warps spend their time, from ncu's per-instruction stall sampling.

Input: `ncu --import REP.ncu-rep --page source --print-source sass --csv > sass.csv` over a report collected with
`--section SourceCounters --section WarpStateStats` (one or more kernels). For each kernel it splits the SASS into
regions by landmarks of the warp-specialized MoE GEMMs (src/cuda/moe/moe_gemm_ws.cuh) - setup, the consumer main
loop (from the first HGMMA back to its loop head), the consumer epilogue (from the first named barrier 1 to the
consumers' EXIT), the producer (the rest) - and prints each region's share of the warp samples, its not-issued share
and top stall reasons, then the top instructions. Shares are of all warps' samples: with 1 producer and 2 consumer
warpgroups the consumers' regions add up to about two thirds.

--by-count groups the instructions instead by how many times each executed (a k loop's body, a unit's epilogue, a
block's tail and a producer's spin each have their own count, whatever the kernel's landmarks): a class a count, its
share of the samples, top stall reasons and most executed opcodes (session 48: the lm_head screen's k loop 64%, its
epilogue 22%, its tail 6%).

    python3 tools/ncu_sass_regions.py sass.csv [--top N] [--by-count]
"""
import argparse
import csv
import sys


def read_kernels(path):
    kernels, cur = [], None
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                cur = {"name": row[1], "hdr": None, "rows": []}
                kernels.append(cur)
            elif row[0] == "Address" and cur is not None:
                cur["hdr"] = row
            elif cur is not None and cur["hdr"] is not None:
                cur["rows"].append(row)
    return kernels


def num(s):
    try:
        return float(s)
    except ValueError:
        return 0.0


def regions(rows):
    """(name, first, end) of the warp-specialized GEMM's regions; one region 'all' when the landmarks are absent."""
    src = [r[1] for r in rows]
    hgmma = [i for i, s in enumerate(src) if "HGMMA" in s]
    bar1 = [i for i, s in enumerate(src) if "BAR.SYNC" in s and " 0x1" in s]
    exits = [i for i, s in enumerate(src) if s.strip().endswith("EXIT")]
    if not hgmma or not bar1:
        return [("all", 0, len(rows))]
    # The loop head: the last mbarrier try-wait before the first HGMMA (the consumer's wait on `full`), minus its
    # index arithmetic; the epilogue ends at the first EXIT after the last named barrier.
    waits = [i for i in range(hgmma[0]) if "SYNCS.PHASECHK" in src[i]]
    loop0 = max(0, (waits[-1] if waits else hgmma[0]) - 12)
    epi0 = max(loop0, bar1[0] - 5)
    epi_end = next((i + 1 for i in exits if i > bar1[-1]), len(rows))
    return [("setup", 0, loop0), ("consumer loop", loop0, epi0), ("epilogue", epi0, epi_end),
            ("producer", epi_end, len(rows))]


def opcode(src):
    s = src.strip()
    if s.startswith("@"):
        s = s.split(None, 1)[1] if " " in s else s
    return s.split()[0] if s else "?"


def by_count(rows, ix, stalls, total, top):
    """A class a distinct execution count: (samples, count, rows) sorted by samples."""
    s_all, s_ex = ix["Warp Stall Sampling (All Samples)"], ix["Instructions Executed"]
    classes = {}
    for r in rows:
        classes.setdefault(num(r[s_ex]), []).append(r)
    ranked = sorted(((sum(num(r[s_all]) for r in part), c, part) for c, part in classes.items()), reverse=True)
    for samples, count, part in ranked[:top]:
        by = sorted(((sum(num(r[ix[c]]) for r in part), c[6:]) for c in stalls), reverse=True)[:4]
        reasons = " ".join(f"{n} {100 * v / total:.1f}" for v, n in by if v > 0)
        ops = {}
        for r in part:
            ops[opcode(r[1])] = ops.get(opcode(r[1]), 0.0) + num(r[s_ex])
        executed = sum(ops.values()) or 1.0
        mix = " ".join(f"{o} {100 * v / executed:.0f}%" for o, v in sorted(ops.items(), key=lambda kv: -kv[1])[:6])
        print(f"   executed {int(count):>9d}x  {len(part):5d} instr  {100 * samples / total:5.1f}%  {reasons}")
        print(f"                                 mix: {mix}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--by-count", action="store_true", help="classes by execution count instead of the GEMM's regions")
    a = ap.parse_args()
    kernels = read_kernels(a.csv)
    if not kernels:
        sys.exit(f"{a.csv}: no 'Kernel Name' rows (expected ncu --page source --print-source sass --csv output)")
    for k in kernels:
        ix = {n: i for i, n in enumerate(k["hdr"])}
        if "Warp Stall Sampling (All Samples)" not in ix:
            sys.exit(f"{a.csv}: no stall sampling column (collect with --section SourceCounters)")
        s_all = ix["Warp Stall Sampling (All Samples)"]
        s_ni = ix.get("Warp Stall Sampling (Not-issued Samples)")
        stalls = [c for c in k["hdr"] if c.startswith("stall_") and "Not Issued" not in c]
        rows = k["rows"]
        total = sum(num(r[s_all]) for r in rows) or 1.0
        print(f"== {k['name']}\n   {int(total)} samples, {len(rows)} instructions")
        if a.by_count:
            if "Instructions Executed" not in ix:
                sys.exit(f"{a.csv}: no 'Instructions Executed' column (collect with --section SourceCounters)")
            by_count(rows, ix, stalls, total, a.top)
            continue
        for name, a0, a1 in regions(rows):
            part = rows[a0:a1]
            share = 100 * sum(num(r[s_all]) for r in part) / total
            ni = 100 * sum(num(r[s_ni]) for r in part) / total if s_ni is not None else float("nan")
            by = sorted(((sum(num(r[ix[c]]) for r in part), c[6:]) for c in stalls), reverse=True)[:5]
            reasons = " ".join(f"{n} {100 * v / total:.1f}" for v, n in by if v > 0)
            print(f"   {name:14s} {share:5.1f}%  not issued {ni:4.1f}%  {reasons}")
        print("   top instructions:")
        for r in sorted(rows, key=lambda r: -num(r[s_all]))[: a.top]:
            by = sorted(((num(r[ix[c]]), c[6:]) for c in stalls), reverse=True)[:2]
            why = " ".join(f"{n} {int(v)}" for v, n in by if v > 0)
            print(f"     {100 * num(r[s_all]) / total:5.1f}%  {r[1].strip()[:64]:64s} {why}")


if __name__ == "__main__":
    main()
