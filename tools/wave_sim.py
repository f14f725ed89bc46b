#!/usr/bin/env python3
"""What a change to the decode step or the prompt steps buys at N concurrent requests (closed loop, as
`moeserve bench --max-concurrency N`): a step-by-step simulation of the scheduler's FCFS chunked prefill over
measured step costs.

Each client sends a prompt of --prompt tokens, wants --out tokens, and sends its next request when one finishes.
A step runs every decoding request once plus up to --budget prompt tokens (whole prompts first come first served,
a prompt split across steps as the scheduler's chunked prefill does); its cost is the decode step of b rows (DECODE_MS,
interpolated) plus the prompt tokens at PROMPT_US_PER_TOKEN (interpolated by the step's prompt tokens).

The cost tables are H200 measurements of q30b8l BF16 (docs/PERF.md): decode steps from `scripts/gpu-ab.sh` (sessions
28-43, served step), prompt tokens from `gpu_profile --mixed` (session 35, 64 decodes + P prompt tokens, after the
prefill attention's work list) and the served 8,192-token prompt step (session 38: 16 decodes + 8,176 tokens).
Calibration: the default budget (8,192) gives 19,475 tok/s at 64 concurrent against 19,489 / 19,492 measured
(session 42); small budgets come out optimistic (576: -5% against -11% measured in session 35; session 64, H100,
256 requests: 2112 +3.4% over 8192 with that machine's riding costs against -1.0% served), because the served runs'
steps carry fewer decodes (ramp, tail, prompts waiting behind the chunk: session 64's step traces, 58.8 decodes a
decode-only step and 47 a mixed one where the simulation has 64 and 54) and the eager mixed steps' host launch and
the prompt-token costs below 512 tokens are not modelled in detail. Its ramp and drain are too costly: --requests
256 against 1,000 says -2.4%, where the server ran 256 prompts 0.15-0.17% below 1,024 (session 65, two H100s,
`scripts/gpu-bench.sh` scenarios conc64 / conc64-1k) - compare runs of the same request count.

  tools/wave_sim.py                                 # the default budget and small budgets
  tools/wave_sim.py --decode-delta-us -50 --prompt-scale 0.9   # decode step 50 us faster, prompt steps 10% faster
  tools/wave_sim.py --prompt-us-per-token 512:1.2,1024:0.95,2048:0.87  # cheaper prompt chunks riding decode steps
  tools/wave_sim.py --budget 8192 --mixed-budget 2048 ...   # a policy: small chunks only while decodes run
"""
import argparse
import bisect

DECODE_MS = [(1, 0.546), (16, 2.09), (33, 2.68), (48, 2.80), (64, 2.85), (128, 3.16), (160, 3.30)]
PROMPT_US_PER_TOKEN = [(128, 4.5), (256, 3.3), (512, 2.4), (1024, 2.16), (2048, 1.95), (4096, 1.8), (8192, 1.71)]
PROMPT_ONLY_MS = 0.5  # a step without decodes still streams every weight once (beyond its tokens' cost)


def interp(table, x):
    xs = [a for a, _ in table]
    if x <= xs[0]:
        return table[0][1]
    if x >= xs[-1]:
        return table[-1][1]
    i = bisect.bisect_right(xs, x)
    (x0, y0), (x1, y1) = table[i - 1], table[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def step_ms(decodes, prompt_tokens, decode_delta_ms=0.0, prompt_scale=1.0, prompt_table=None):
    t = interp(DECODE_MS, decodes) + decode_delta_ms if decodes > 0 else PROMPT_ONLY_MS
    if prompt_tokens > 0:
        t += interp(prompt_table or PROMPT_US_PER_TOKEN, prompt_tokens) * prompt_scale * prompt_tokens / 1000.0
    return t


def simulate(conc, prompt, out, budget, requests, decode_delta_ms=0.0, prompt_scale=1.0, prompt_table=None,
             mixed_budget=None):
    """Output tokens/s after the first eighth of the requests (the ramp) until the last finishes. mixed_budget: the
    prompt tokens of a step that has decodes, where it differs from a prompt-only step's budget."""
    t = 0.0
    waiting = [prompt] * conc  # prompt tokens still to run, FCFS
    running = []  # output tokens still to produce
    done = sent = produced = 0
    sent = conc
    t0 = p0 = None
    while done < requests:
        p, first_tokens, queue = 0, 0, []
        step_budget = mixed_budget if running and mixed_budget else budget
        for rem in waiting:
            take = min(rem, step_budget - p)
            p += take
            if take == rem:
                first_tokens += 1
            else:
                queue.append(rem - take)
        t += step_ms(len(running), p, decode_delta_ms, prompt_scale, prompt_table)
        produced += len(running) + first_tokens
        running = [r - 1 for r in running]
        finished = sum(1 for r in running if r == 0)
        running = [r for r in running if r > 0] + [out - 1] * first_tokens
        waiting = queue
        done += finished
        if t0 is None and done >= requests // 8:
            t0, p0 = t, produced
        for _ in range(finished):
            if sent < requests + conc:
                waiting.append(prompt)
                sent += 1
    return (produced - p0) / (t - t0) * 1000.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--out", type=int, default=128)
    ap.add_argument("--budget", type=int, action="append", help="prompt tokens a step (repeatable; default 8192 and smaller)")
    ap.add_argument("--requests", type=int, default=2048)
    ap.add_argument("--decode-delta-us", type=float, default=0.0, help="added to every step that has decodes")
    ap.add_argument("--prompt-scale", type=float, default=1.0, help="multiplies the prompt tokens' cost")
    ap.add_argument("--prompt-us-per-token", metavar="P:US,...",
                    help="the change's prompt-token costs by step prompt tokens (e.g. 512:1.2,1024:0.95,2048:0.87), "
                         "replacing the measured table's entries up to the largest P given")
    ap.add_argument("--mixed-budget", type=int, help="prompt tokens of a step with decodes (a scheduler policy: "
                    "--budget then bounds the prompt-only steps)")
    a = ap.parse_args()
    changed = dict(PROMPT_US_PER_TOKEN)
    if a.prompt_us_per_token:
        given = {int(k): float(v) for k, v in (kv.split(":") for kv in a.prompt_us_per_token.split(","))}
        changed = {k: v for k, v in changed.items() if k > max(given)} | given
    for budget in a.budget or [8192, 4160, 2112, 1088, 576]:
        base = simulate(a.concurrency, a.prompt, a.out, budget, a.requests, mixed_budget=a.mixed_budget)
        new = simulate(a.concurrency, a.prompt, a.out, budget, a.requests, a.decode_delta_us / 1000.0, a.prompt_scale,
                       sorted(changed.items()), a.mixed_budget)
        is_change = a.decode_delta_us or a.prompt_scale != 1.0 or a.prompt_us_per_token
        print(f"budget {budget:5d}: {base:8.0f} tok/s with the measured costs" +
              (f", {new:8.0f} with the change ({new / base - 1:+.1%})" if is_change else ""))


if __name__ == "__main__":
    main()
