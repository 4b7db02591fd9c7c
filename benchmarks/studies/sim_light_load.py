"""How close each policy comes to the bound as load falls (issue 13's light-load target).

The Mooncake conversation trace on one simulated cluster (default 8 workers x 8192 pages of 16
tokens, `cpu` timing), replayed at a range of speedups (arrival times divided by it: 2.5 is
bench_sim.py's cell, 0.05 is 50x lighter). For each policy and load: hit rate, TTFT p50 and
p90, and each as a multiple of the bound (TTFT if every request hit its whole infinite-cache
prefix on an idle worker, `bound_p50` / `bound_p90`). The target: where every policy is within
10% of the bound, ttft is within 5%.

    .venv/bin/python benchmarks/studies/sim_light_load.py [--speedups 2.5,1,0.5,0.25,0.1,0.05]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from radixray.sim import SimConfig, load_mooncake, simulate, timing_preset

POLICIES = (
    "ttft",
    "cache_aware",
    "cache_aware_smallest_cache",
    "kv_cost",
    "least_load",
    "round_robin",
)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--speedups", default="2.5,1,0.5,0.25,0.1,0.05")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--pages", type=int, default=8192)
    p.add_argument("--timing", default="cpu")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--out", default="/tmp/sim_light_load.json")
    p.add_argument("--plot", default="benchmarks/studies/sim_light_load.png", help="'' for none")
    p.add_argument("--limit", type=int, default=None, help="the first N requests of the trace")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: two loads, two policies, the first 200 requests, no plot",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.speedups, args.policies, args.plot = "2.5,0.1", "ttft,least_load", ""
        args.limit = args.limit or 200
    speedups = [float(x) for x in args.speedups.split(",")]
    policies = args.policies.split(",")
    cfg = SimConfig(
        num_workers=args.workers,
        num_pages=args.pages,
        page_size=16,
        timing=timing_preset(args.timing),
        event_delay_s=0.05,
        seed=0,
    )
    rows = {}
    for sp in speedups:
        wl = load_mooncake("mooncake", block_tokens=16, speedup=sp, limit=args.limit, seed=0)
        for pol in policies:
            s = simulate(wl, pol, cfg, progress=f"x{sp:g} {pol}").summary()
            rows[(sp, pol)] = s
            print(
                f"speedup {sp:g} {pol:28s} hit {s['hit_rate']:.3f}  p50 {s['ttft_p50']:.3f} "
                f"({s['ttft_p50'] / s['bound_p50']:.2f}x bound)  p90 {s['ttft_p90']:.3f} "
                f"({s['ttft_p90'] / s['bound_p90']:.2f}x)",
                flush=True,
            )
    lines = [
        "| speedup | policy | hit | TTFT p50 s | / bound | TTFT p90 s | / bound |",
        "|---|---|---|---|---|---|---|",
    ]
    for (sp, pol), s in rows.items():
        lines.append(
            f"| {sp:g} | {pol} | {s['hit_rate']:.3f} | {s['ttft_p50']:.3f} | "
            f"{s['ttft_p50'] / s['bound_p50']:.2f} | {s['ttft_p90']:.3f} | "
            f"{s['ttft_p90'] / s['bound_p90']:.2f} |"
        )
    print("\n" + "\n".join(lines))
    Path(args.out).write_text(
        json.dumps([{"speedup": sp, "policy": pol, **s} for (sp, pol), s in rows.items()])
    )
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
        for ax, q in zip(axes, ("p50", "p90"), strict=True):
            for pol in policies:
                ys = [
                    rows[(sp, pol)][f"ttft_{q}"] / rows[(sp, pol)][f"bound_{q}"] for sp in speedups
                ]
                ax.plot(speedups, ys, marker="o", label=pol, lw=2.5 if pol == "ttft" else 1.2)
            ax.axhline(1.05, color="grey", ls=":", lw=1)
            ax.set_xscale("log")
            ax.set_xlabel("load (trace speedup)")
            ax.set_ylabel(f"TTFT {q} / bound {q}")
            ax.set_title(f"TTFT {q} over the bound, {args.workers} x {args.pages} pages")
        axes[0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
