"""How much of a simulated comparison is the seed: the same cells with the simulator's and the
policies' seeds 0..N-1 (tie-breaks, kv_cost's and ttft's random choices). bench_sim.py reports
seed 0; a ratio between two policies is only as good as its spread over seeds.

    .venv/bin/python benchmarks/sim_seed_spread.py [--seeds 4] [--policies ttft,cache_aware,kv_cost]
"""

from __future__ import annotations

import argparse
import statistics
import sys

from radixray.router.policies import make_policy
from radixray.sim import SimConfig, load_mooncake, simulate, timing_preset


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--cells", default="8x8192,16x2048", help="WORKERSxPAGES, comma-separated")
    p.add_argument("--policies", default="ttft,cache_aware,kv_cost")
    p.add_argument("--timing", default="cpu")
    p.add_argument("--speedup-per-8", type=float, default=2.5)
    args = p.parse_args(argv)
    policies = args.policies.split(",")
    print("| cell | policy | excess p50 by seed | excess p99 by seed | median p50 | median p99 |")
    print("|---|---|---|---|---|---|")
    for cell in args.cells.split(","):
        workers, pages = (int(x) for x in cell.split("x"))
        speedup = args.speedup_per_8 * workers / 8
        wl = load_mooncake("mooncake", block_tokens=16, speedup=speedup, seed=0)
        runs: dict[str, list[dict]] = {}
        for pol in policies:
            runs[pol] = []
            for seed in range(args.seeds):
                cfg = SimConfig(
                    num_workers=workers,
                    num_pages=pages,
                    page_size=16,
                    timing=timing_preset(args.timing),
                    event_delay_s=0.05,
                    seed=seed,
                )
                runs[pol].append(simulate(wl, make_policy(pol, seed=seed), cfg).summary())
            p50 = [s["excess_p50"] for s in runs[pol]]
            p99 = [s["excess_p99"] for s in runs[pol]]
            print(
                f"| {cell} | {pol} | {' / '.join(f'{x:.3f}' for x in p50)} | "
                f"{' / '.join(f'{x:.3f}' for x in p99)} | {statistics.median(p50):.3f} | "
                f"{statistics.median(p99):.3f} |",
                flush=True,
            )
        if "ttft" in runs:
            for q in ("excess_p50", "excess_p99"):
                per_seed = [
                    runs["ttft"][k][q] / min(runs[b][k][q] for b in runs if b != "ttft")
                    for k in range(args.seeds)
                ]
                print(
                    f"| {cell} | ttft / best other, {q} | "
                    f"{' / '.join(f'x{r:.2f}' for r in per_seed)} | | "
                    f"median x{statistics.median(per_seed):.2f} | |"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
