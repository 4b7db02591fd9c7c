"""Where each request's TTFT above the bound goes, in the simulator: hits below the infinite-cache
ceiling, or waiting for and sharing steps with other requests.

For every request: bound = its own prefill with the whole infinite-cache prefix hit, on an idle
worker (``radixray.sim.results.ttft_bound``); own = its own prefill with the hits it actually got,
on an idle worker; TTFT - bound = (own - bound) + (TTFT - own).

    .venv/bin/python benchmarks/studies/sim_excess_breakdown.py \\
        [--workers 8 --pages 8192 --speedup 2.5]
"""

from __future__ import annotations

import argparse

from radixray.numbers import percentile
from radixray.sim import SimConfig, load_mooncake, simulate
from radixray.sim.results import ttft_bound


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--pages", type=int, default=8192)
    p.add_argument("--speedup", type=float, default=2.5)
    p.add_argument("--policies", default="cache_aware,kv_cost,ttft")
    p.add_argument("--limit", type=int, default=None, help="the first N requests of the trace")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: ttft and cache_aware on the first 200 requests",
    )
    args = p.parse_args()
    if args.quick:
        args.policies, args.limit = "cache_aware,ttft", args.limit or 200
    wl = load_mooncake("mooncake", block_tokens=16, speedup=args.speedup, limit=args.limit)
    cfg = SimConfig(num_workers=args.workers, num_pages=args.pages, page_size=16)
    print("| policy | TTFT p50 s | mean TTFT - bound s | of it: hits below ceiling | waiting / "
          "shared steps | median wait s | p90 wait s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for policy in args.policies.split(","):
        r = simulate(wl, policy, cfg, progress=policy)
        ttft = [x.ttft for x in r.records]
        own = ttft_bound(wl, 16, cfg.timing, [x.cached for x in r.records])  # hits it got
        wait = [t - o for t, o in zip(ttft, own, strict=True)]
        miss = [o - b for o, b in zip(own, r.bound, strict=True)]
        n = len(ttft)
        print(
            f"| {policy} | {percentile(ttft, 50):.3f} | {(sum(ttft) - sum(r.bound)) / n:.3f} | "
            f"{sum(miss) / n:.3f} | {sum(wait) / n:.3f} | {percentile(wait, 50):.3f} | "
            f"{percentile(wait, 90):.3f} |"
        )


if __name__ == "__main__":
    main()
