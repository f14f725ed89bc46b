#!/usr/bin/env python3
"""One line on a scenario's GPU samples (scripts/gpu-bench.sh, GPU_SAMPLE): the SM clock and power draw over the
samples in which the GPU was busy.

    tools/gpu_samples.py SAMPLES.csv MODEL SCENARIO

SAMPLES.csv: `nvidia-smi --query-gpu=clocks.sm,power.draw[.instant],utilization.gpu --format=csv,noheader,nounits
-lms N` output (MHz, W, %). Busy: utilization over 50%. Prints the count, the clock's 10th percentile and median, the
share of busy samples more than 5% below the highest clock seen, and the power's median and 90th percentile.
"""
import sys


def percentile(sorted_values, q):
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


def summarize(lines):
    clocks, powers = [], []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            continue
        try:
            clock, power, util = float(parts[0]), float(parts[1]), float(parts[2])
        except ValueError:  # "[N/A]" or an error line
            continue
        if util > 50:
            clocks.append(clock)
            powers.append(power)
    if not clocks:
        return "no busy samples"
    clocks.sort()
    powers.sort()
    top = clocks[-1]
    slow = sum(1 for c in clocks if c < 0.95 * top) / len(clocks)
    return (f"{len(clocks)} busy samples: SM clock p10 {percentile(clocks, 0.1):.0f} / p50 {percentile(clocks, 0.5):.0f} MHz "
            f"({100 * slow:.0f}% more than 5% below {top:.0f}), power p50 {percentile(powers, 0.5):.0f} / "
            f"p90 {percentile(powers, 0.9):.0f} W")


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: gpu_samples.py SAMPLES.csv MODEL SCENARIO")
    path, model, scenario = sys.argv[1:]
    try:
        with open(path) as f:
            text = summarize(f)
    except OSError as e:
        text = f"no samples ({e.strerror})"
    print(f"{model:<8} {scenario:<9} GPU: {text}")


if __name__ == "__main__":
    main()
