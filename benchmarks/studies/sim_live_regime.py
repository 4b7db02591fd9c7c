"""Does the live saturation run's gap reproduce in the simulator?

The live comparison past saturation (benchmarks/HISTORY.md, "Live: past saturation") runs four
tiny-model workers with 4-token steps on two shared cores; this replays its requests (the
Mooncake replay at scale 32 as the load generator builds it, each prompt tokenized as the
workers tokenize it, the load generator's own Poisson arrival times for the first 30 s) on four
simulated workers of 768 pages of 16, with a timing model fitted to one such worker by
``radixray sim calibrate --model tiny --cpu-threads 1``, scaled by ``--contention`` (the
slowdown of four workers sharing the cores) and given the live step budget. Prints each
policy's TTFT p50 / p99 (ms), hit rate and throughput per arrival seed, and the medians.

    .venv/bin/radixray sim calibrate --model tiny --cpu-threads 1 --out /tmp/tiny_1t.json
    .venv/bin/python benchmarks/studies/sim_live_regime.py --timing /tmp/tiny_1t.json \\
        --rate 10 --contention 4.5
"""

from __future__ import annotations

import argparse
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_sim_vs_live import sim_workload, slowed  # noqa: E402

from radixray.bench.workloads import build_workload  # noqa: E402
from radixray.sim import SimConfig, Workload, simulate  # noqa: E402
from radixray.sim.timing import load_timing  # noqa: E402


def run(args: tuple) -> tuple[tuple, tuple]:
    """One policy on one arrival seed: ((policy, seed), (p50 ms, p99 ms, hit, req/s))."""
    policy, seed, opts = args
    wl = build_workload("mooncake", limit=opts.requests, block_tokens=16, sample_every=10)
    full = sim_workload(wl, opts.rate, seed, 16, "tiny")
    reqs = [r for r in full.requests if r.arrival < opts.duration]
    sw = Workload(full.name, reqs, full.first_block_tokens, full.description)
    solo = load_timing(opts.timing)
    timing = slowed(solo, opts.contention, max_batch_tokens=opts.max_batch_tokens)
    cfg = SimConfig(num_workers=opts.workers, num_pages=768, page_size=16, timing=timing, seed=seed)
    s = simulate(sw, policy, cfg).summary()
    row = (s["ttft_p50"] * 1e3, s["ttft_p99"] * 1e3, s["hit_rate"], s["throughput"])
    return (policy, seed), row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--timing", help="a `radixray sim calibrate` file of the tiny model")
    p.add_argument("--rate", type=float, default=10.0, help="requests per second")
    p.add_argument("--contention", type=float, default=4.5, help="the timing's slowdown")
    p.add_argument("--max-batch-tokens", type=int, default=4)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--requests", type=int, default=1174)
    p.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--policies", default="ttft,cache_aware")
    p.add_argument("--quick", action="store_true", help="2 seeds, 5 s of arrivals")
    opts = p.parse_args(argv)
    if opts.quick:
        opts.seeds, opts.duration = 2, 5.0
        opts.timing = opts.timing or str(Path(__file__).parents[1] / "timing_smollm2_cpu.json")
    if not opts.timing:
        p.error("--timing is required (a file from `radixray sim calibrate`)")
    policies = opts.policies.split(",")
    jobs = [(pol, seed, opts) for pol in policies for seed in range(opts.seeds)]
    with ProcessPoolExecutor(2) as ex:
        res = dict(ex.map(run, jobs))
    print(f"rate {opts.rate:g}/s, contention x{opts.contention:g}, {opts.max_batch_tokens}-token "
          f"steps, {opts.workers} workers; per seed, then the median")  # fmt: skip
    print("| policy | TTFT p50 ms | TTFT p99 ms | hit rate | req/s |")
    print("|---|---|---|---|---|")
    for pol in policies:
        rs = [res[(pol, seed)] for seed in range(opts.seeds)]
        cells = []
        for i, fmt in enumerate(("{:.0f}", "{:.0f}", "{:.3f}", "{:.2f}")):
            each = " / ".join(fmt.format(r[i]) for r in rs)
            cells.append(f"{fmt.format(statistics.median(r[i] for r in rs))} ({each})")
        print(f"| {pol} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
