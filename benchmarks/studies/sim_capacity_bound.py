"""How much of the excess over the bound is cache capacity: the bound again, with the cluster's
own cache size.

The issue's bound (``bound_p*``) gives every request the hits of an *infinite* cache on an idle
worker. When the cluster's caches hold a small part of what the trace reuses (Mooncake at its
real scale: 93.6M distinct tokens against 8 x 2,000 pages of 512 = 8.2M), part of every policy's
excess is capacity, which no routing removes. The *pooled* bound gives each request the hits of
one LRU radix cache (the worker's own ``RadixCache``) with all the cluster's pages, every earlier
request's full pages inserted when it arrives (nothing in flight, nothing locked): what a
cluster of this size could reuse if it were one worker (``radixray.sim.results.pooled_hits``;
every simulator report has it as ``pooled_ttft_p*`` and ``pooled_excess_p*``). It is a
reference, not a strict bound: caches kept apart can keep pages one shared LRU order evicts.
Each policy's excess is printed against both, as the issue measures it (percentile of TTFT minus
the same percentile of the bound), and ttft's as a multiple of the best baseline's.

    .venv/bin/python benchmarks/studies/sim_capacity_bound.py   # real scale and 8 x 8192 cpu
"""

from __future__ import annotations

import argparse
import sys

from radixray.sim import SimConfig, load_mooncake, simulate, timing_preset

BASELINES = ("cache_aware", "cache_aware_smallest_cache", "kv_cost", "least_load")
CELLS = {
    # name: (block tokens = page size, workers, pages per worker, timing, speedup)
    "real-scale-gpu": (512, 8, 2000, "gpu", 1.0),
    "8x8192-cpu": (16, 8, 8192, "cpu", 2.5),
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cells", default=",".join(CELLS), help=f"some of: {', '.join(CELLS)}")
    p.add_argument("--limit", type=int, default=None, help="the first N requests of the trace")
    p.add_argument(
        "--quick", action="store_true", help="a smoke run: 8x8192-cpu on the first 200 requests"
    )
    args = p.parse_args(argv)
    if args.quick:
        args.cells, args.limit = "8x8192-cpu", args.limit or 200
    for name in args.cells.split(","):
        bt, workers, pages, timing_name, speedup = CELLS[name]
        timing = timing_preset(timing_name)
        wl = load_mooncake("mooncake", block_tokens=bt, speedup=speedup, limit=args.limit, seed=0)
        cfg = SimConfig(
            num_workers=workers,
            num_pages=pages,
            page_size=bt,
            timing=timing,
            event_delay_s=0.05,
            seed=0,
        )
        rows = {}
        for pol in (*BASELINES, "ttft"):
            rows[pol] = simulate(wl, pol, cfg).summary()
        print(
            f"\n#### {name}: {workers} workers x {pages} pages of {bt} ({timing_name} timing, "
            f"speedup {speedup:g}); hit rate: infinite cache {rows['ttft']['ceiling']:.3f}, one "
            f"pooled cache of the cluster's pages {rows['ttft']['pooled_hit_rate']:.3f}\n"
        )
        print(
            "| policy | hit | TTFT p50 s | p99 s | excess over the bound p50 | p99 | "
            "excess over the pooled-cache bound p50 | p99 |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for pol, s in rows.items():
            print(
                f"| {pol} | {s['hit_rate']:.3f} | {s['ttft_p50']:.3f} | {s['ttft_p99']:.2f} | "
                f"{s['excess_p50']:.3f} | {s['excess_p99']:.3f} | {s['pooled_excess_p50']:.3f} | "
                f"{s['pooled_excess_p99']:.3f} |"
            )
        b50, b99 = rows["ttft"]["pooled_ttft_p50"], rows["ttft"]["pooled_ttft_p99"]
        print(
            f"| *bound* (infinite cache) | {rows['ttft']['ceiling']:.3f} | "
            f"{rows['ttft']['bound_p50']:.3f} | {rows['ttft']['bound_p99']:.2f} | | | | |"
        )
        pooled_hit = rows["ttft"]["pooled_hit_rate"]
        print(f"| *pooled-cache bound* | {pooled_hit:.3f} | {b50:.3f} | {b99:.2f} | | | | |")
        for key in ("excess_p50", "excess_p99", "pooled_excess_p50", "pooled_excess_p99"):
            best = min(BASELINES, key=lambda k, key=key: rows[k][key])
            ratio = rows["ttft"][key] / rows[best][key] if rows[best][key] > 0 else float("inf")
            print(f"ttft {key}: x{ratio:.2f} of the best baseline's ({best})")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
