"""Bursts split across a fleet of routers: does each router's partial view herd them?

In one process: 4 real workers (tiny model) and 1, 2 or 4 routers (RouterServices, each with its
own pool, index and policy, all seeded alike as replicas of one config are) polling the same
workers. A burst is sent all at once, its requests spread round-robin over the routers, before
any load report can show them. Three bursts:

* ``one each``: one cold request per router: each router sees the same idle workers;
* ``distinct``: 16 cold requests (no shared prefix);
* ``shared``: 24 requests sharing a new 320-token prefix.

Measured: the busiest worker's share of the burst (1/4 is even), over 3 bursts each, with the
routers aware of each other (ranks from the workers' reports, ``Policy.pick_tied``) and blind
(each believes it is alone).
Command: ``.venv/bin/python benchmarks/studies/bench_burst.py`` (~1 min; ``--quick``: seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import statistics

from radixray.bench.inprocess_fleet import drain, fleet, hosts_for, until
from radixray.protocol import GenerateRequest, SamplingParams

PARAMS = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
POLICIES = ("ttft", "kv_cost", "cache_aware", "least_load")


def _burst(kind: str, n_routers: int, rng: random.Random, tag: str) -> list[list[int]]:
    if kind == "one each":
        return [[rng.randrange(3, 250) for _ in range(160)] for _ in range(n_routers)]
    if kind == "distinct":
        return [[rng.randrange(3, 250) for _ in range(160)] for _ in range(16)]
    prefix = [rng.randrange(3, 250) for _ in range(320)]
    return [prefix + [i % 200 + 3, 7] for i in range(24)]


async def _run(
    hosts, policy: str, n_routers: int, kind: str, aware: bool, bursts: int
) -> list[float]:
    async with fleet(hosts, n_routers, policy=policy) as services:
        await until(lambda: all(len(s.pool.fleet) == n_routers for s in services))
        if not aware:
            for s in services:
                s.pool.fleet_position = lambda: (0, 1)
        rng = random.Random(f"{policy}{n_routers}{kind}{aware}")
        shares = []
        for b in range(bursts):
            for s in services:
                await s.pool.poll_once()
            prompts = _burst(kind, n_routers, rng, f"{b}")

            async def one(i, ids, b=b):
                s = services[i % n_routers]
                req = GenerateRequest(f"{policy}-{kind}-{aware}-{b}-{i}", ids, PARAMS)
                return await drain(await s.open(req, None))

            workers = await asyncio.gather(*(one(i, ids) for i, ids in enumerate(prompts)))
            shares.append(max(collections.Counter(workers).values()) / len(workers))
        return shares


async def main(policies=POLICIES, routers=(1, 2, 4), bursts: int = 3) -> None:
    print("| policy | burst | routers | busiest share, routers aware | blind |")
    print("|---|---|---:|---:|---:|")
    for policy in policies:
        for kind in ("one each", "distinct", "shared"):
            for n in routers:
                if kind == "one each" and n == 1:
                    continue
                hosts = hosts_for(4)
                try:
                    aware = await _run(hosts, policy, n, kind, True, bursts)
                    blind = await _run(hosts, policy, n, kind, False, bursts) if n > 1 else aware
                finally:
                    for h in hosts:
                        h.shutdown()
                print(
                    f"| {policy} | {kind} | {n} | {statistics.mean(aware):.2f} |"
                    f" {statistics.mean(blind):.2f} |",
                    flush=True,
                )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="ttft only, 2 routers, 1 burst each")
    args = ap.parse_args()
    if args.quick:
        asyncio.run(main(("ttft",), (2,), 1))
    else:
        asyncio.run(main())
