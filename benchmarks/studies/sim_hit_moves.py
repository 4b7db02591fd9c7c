"""Where a policy's hit rate goes, in the simulator: prefixes no worker held, or prefixes held
on a worker the policy did not choose.

For every decision: available = the longest prefix any worker holds (the router's index, both
tiers, at most the prompt less one token); taken = what the chosen worker holds. Each is summed
over the run as a share of all prompt tokens (taken is the hit rate the router predicted; the
run's measured hit rate is printed beside it). A policy's hit rate is below another's either
because less was available (its placements left less cached) or because it moved requests off
their holders (available - taken): the moves, their count and the share of prompt tokens they
recomputed.

    .venv/bin/python benchmarks/studies/sim_hit_moves.py \\
        [--speedup 1.5 --seed 0 --policies ttft,cache_aware,ttft:reuse_weight=4]
"""

from __future__ import annotations

import argparse

from radixray.router.policies import make_policy
from radixray.sim import SimConfig, load_mooncake, simulate, timing_preset


class Counted:
    """Wraps a policy's ``choose`` and sums, per decision, the prefix available and taken."""

    def __init__(self, policy):
        self.policy = policy
        self.prompt = self.available = self.taken = self.moves = 0
        inner = policy.choose

        def choose(request, workers, index):
            decision = inner(request, workers, index)
            held = index.match_tiers(request.block_hashes) if request.block_hashes else {}
            P, cap = index.page_size, max(request.num_tokens - 1, 0)
            best = max((min(both * P, cap) for _, both in held.values()), default=0)
            took = min(held.get(decision.worker_id, (0, 0))[1] * P, cap)
            self.prompt += request.num_tokens
            self.available += best
            self.taken += took
            self.moves += took < best
            return decision

        policy.choose = choose


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
    print("| policy | hit rate | available | taken | moved off holder | moves | p50 s | p99 s |")
    print("|---|---|---|---|---|---|---|---|")
    for spec in args.policies.split(","):
        cfg = SimConfig(
            num_workers=args.workers,
            num_pages=args.pages,
            page_size=16,
            timing=timing_preset(args.timing),
            seed=args.seed,
        )
        counted = Counted(make_policy(spec, seed=args.seed))
        s = simulate(wl, counted.policy, cfg).summary()
        n = counted.prompt or 1
        print(
            f"| {spec} | {s['hit_rate']:.4f} | {counted.available / n:.4f} | "
            f"{counted.taken / n:.4f} | {(counted.available - counted.taken) / n:.4f} | "
            f"{counted.moves} | {s['ttft_p50']:.3f} | {s['ttft_p99']:.3f} |"
        )


if __name__ == "__main__":
    main()
