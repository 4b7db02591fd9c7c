"""Where a policy's hit rate goes, in the simulator: prefixes no worker held, or prefixes held
on a worker the policy did not choose.

For every decision, as the simulator records it (``DecisionRecord.available`` and
``captured``; the run's ``reuse_available`` and ``reuse_captured``): available = the longest
prefix any worker held by the router's index; taken = what the chosen worker held. Each is a
share of all prompt tokens (taken is the hit rate the router predicted; the run's measured hit
rate is printed beside it). A policy's hit rate is below another's either because less was
available (its placements left less cached) or because it moved requests off their holders
(available - taken: the share of prompt tokens recomputed there, and how many requests moved).

    .venv/bin/python benchmarks/studies/sim_hit_moves.py \\
        [--speedup 1.5 --seed 0 --policies ttft,cache_aware,ttft:reuse_weight=4]
"""

from __future__ import annotations

import argparse

from radixray.sim import SimConfig, load_mooncake, simulate, timing_preset


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--pages", type=int, default=8192)
    p.add_argument("--timing", default="cpu")
    p.add_argument("--speedup", type=float, default=1.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--policies", default="ttft,cache_aware")
    p.add_argument("--limit", type=int, default=None, help="the first N requests of the trace")
    p.add_argument("--quick", action="store_true", help="a smoke run: the first 300 requests")
    args = p.parse_args()
    if args.quick:
        args.limit = args.limit or 300
    wl = load_mooncake(
        "mooncake", block_tokens=16, speedup=args.speedup, limit=args.limit, seed=args.seed
    )
    cfg = SimConfig(
        num_workers=args.workers,
        num_pages=args.pages,
        page_size=16,
        timing=timing_preset(args.timing),
        seed=args.seed,
    )
    print("| policy | hit rate | available | taken | moved off holder | moves | p50 s | p99 s |")
    print("|---|---|---|---|---|---|---|---|")
    for spec in args.policies.split(","):
        run = simulate(wl, spec, cfg)
        s = run.summary()
        available, taken = s["reuse_available"], s["reuse_captured"]
        moves = sum(r.captured < r.available for r in run.records)
        print(
            f"| {spec} | {s['hit_rate']:.4f} | {available:.4f} | {taken:.4f} | "
            f"{available - taken:.4f} | {moves} | {s['ttft_p50']:.3f} | {s['ttft_p99']:.3f} |"
        )


if __name__ == "__main__":
    main()
