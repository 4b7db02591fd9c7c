"""Load sweep in the routing simulator: one workload at rising arrival rates, every policy, TTFT
p50 / p99 and hit rate against offered load, and each policy's sustainable rate.

The **sustainable rate** of a policy is the highest speedup on the grid whose whole-run TTFT
p50 stays within 2x the bound's p50 (the bound: every request hits its whole infinite-cache
prefix on an idle worker), at that speedup and every lower one. Every request is served (past
saturation the queue grows with the run, the same run for every policy) unless ``--admission``
models the live router's admission limits (``RouterSettings``: 1,024 requests in flight, 256
on every worker, or a wait over 30 s before a request's prefill on the least-queued worker);
then refused requests are counted beside the percentiles of the served ones, so that no policy
wins by refusing more.

Checks ttft against the best baseline at each speed (TTFT p50 and p99 <= 1.0x, hit >= 0.97x)
and its sustainable rate against theirs; medians over ``--seeds``.

    .venv/bin/python benchmarks/bench_sim_load.py                 # Mooncake 8 x 8192, 1..6
    .venv/bin/python benchmarks/bench_sim_load.py --admission     # with the router's 429s
    .venv/bin/python benchmarks/bench_sim_load.py --quick         # a smoke run (seconds)

``--baselines-from`` takes the baselines' points from an earlier run's ``--out`` JSON (same
workload, cluster, seeds and speeds: the simulator is deterministic, so a change to ttft alone
need not rerun them) and runs only the policies it lacks.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from datetime import date
from pathlib import Path

from radixray.router.service import RouterSettings
from radixray.sim import (
    SimConfig,
    azure_shared_prefix,
    hot_prefix,
    load_mooncake,
    multiturn_chat,
    simulate,
    timing_preset,
)
from radixray.worker.scheduler_config import PREFILL_ORDERS

# The peers as their current code decides (smg 1.13.0 text and event modes, Dynamo's current
# cost), least_load, and for one release the rules they replace (cache_aware_v03 with both of
# its fallbacks, kv_cost_summed), so that a table shows both.
BASELINES = ["cache_aware", "cache_aware_events", "kv_cost", "least_load"]
OLD_BASELINES = ["cache_aware_v03", "cache_aware_smallest_cache", "kv_cost_summed"]
OURS = "ttft"
# The live router's admission defaults (radixray.router.service.RouterSettings): requests in
# flight, on every worker, and the queueing delay in seconds (radixray/router/admission.py).
ADMISSION = (
    RouterSettings.max_inflight,
    RouterSettings.max_inflight_per_worker,
    RouterSettings.max_queue_s,
)
METRICS = (
    "ttft_p50", "ttft_p99", "hit_rate", "bound_p50", "bound_p99", "refused", "requests", "goodput",
)  # fmt: skip


def workload(name: str, speedup: float, limit: int | None, seed: int):
    """``name`` at ``speedup`` times its base rate (hot_prefix: 10 requests/s, multiturn_chat:
    4 requests/s, their defaults; azure_conv / azure_code: the Azure trace's arrivals with 16
    shared system prompts, a workload no rule was tuned on)."""
    if name == "mooncake":
        return load_mooncake("mooncake", block_tokens=16, speedup=speedup, limit=limit, seed=seed)
    n = limit or 3000
    if name in ("azure_conv", "azure_code"):
        return azure_shared_prefix(n, speedup=speedup, service=name[6:], seed=seed)
    if name == "hot_prefix":
        return hot_prefix(num_requests=n, rate=10.0 * speedup, seed=seed)
    if name == "multiturn_chat":
        return multiturn_chat(num_requests=n, rate=4.0 * speedup, seed=seed)
    raise ValueError(
        f"unknown workload {name!r}: mooncake, hot_prefix, multiturn_chat, azure_conv or azure_code"
    )


def run_point(speedup: float, seed: int, args, names: list[str]) -> dict[str, dict]:
    """Every policy of ``names`` on the workload at ``speedup`` with ``seed``."""
    wl = workload(args.workload, speedup, args.limit, seed)
    limit, per_worker, max_queue_s = ADMISSION if args.admission else (None, None, None)
    budget = {"max_batch_tokens": args.max_batch_tokens} if args.max_batch_tokens else {}
    cfg = SimConfig(
        num_workers=args.workers,
        num_pages=args.pages,
        page_size=16,
        timing=timing_preset(args.timing, **budget),
        seed=seed,
        max_inflight=limit,
        max_inflight_per_worker=per_worker,
        max_queue_s=max_queue_s,
        prefill_order=args.prefill_order,
    )
    out = {}
    for name in names:
        r = simulate(wl, args.ours if name == OURS else name, cfg)
        s = r.summary() | {"goodput": r.goodput(args.slo)}
        out[name] = {k: s[k] for k in METRICS}
    return out


def run_all(args, names: list[str], stored: dict) -> dict[float, dict[str, dict]]:
    """Every speedup's point (medians over the seeds), the policies ``stored`` has taken from
    it; with ``--jobs`` the (speedup, seed) runs go to parallel processes."""
    speeds = [float(x) for x in args.speedups.split(",")]
    old = {s: {n: v for n, v in stored.get(s, {}).items() if n in names and n != OURS}
           for s in speeds}  # fmt: skip
    tasks = [(s, seed, [n for n in names if n not in old[s]]) for s in speeds
             for seed in range(args.seeds)]  # fmt: skip
    t0, done = time.perf_counter(), {}
    with ProcessPoolExecutor(args.jobs) if args.jobs > 1 else nullcontext() as pool:
        futures = [pool.submit(run_point, s, seed, args, run) for s, seed, run in tasks] \
            if pool else [None] * len(tasks)  # fmt: skip
        for k, ((s, seed, run), fut) in enumerate(zip(tasks, futures, strict=True)):
            done[s, seed] = fut.result() if fut else run_point(s, seed, args, run)
            print(f"[{k + 1}/{len(tasks)}] speedup {s:g} seed {seed}: "
                  f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)  # fmt: skip
    return {
        s: {n: (old[s] | median_over_seeds([done[s, k] for k in range(args.seeds)]))[n]
            for n in names}
        for s in speeds
    }  # fmt: skip


def stored_points(path: str | None) -> dict[float, dict[str, dict]]:
    """The points of an earlier run's ``--out`` JSON, by speedup (none without a path)."""
    if not path:
        return {}
    with open(path) as f:
        return {float(k): v for k, v in json.load(f)["points"].items()}


def median_over_seeds(runs: list[dict[str, dict]]) -> dict[str, dict]:
    return {
        p: {k: statistics.median(r[p].get(k, math.nan) for r in runs) for k in METRICS}
        for p in runs[0]
    }


def sustainable(points: dict[float, dict[str, dict]], policy: str) -> float | None:
    """The highest speedup whose p50 (and every lower one's) is within 2x the bound's."""
    best = None
    for s in sorted(points):
        v = points[s][policy]
        if v["ttft_p50"] > 2.0 * v["bound_p50"]:
            break
        best = s
    return best


def verdict(points: dict[float, dict[str, dict]], names: list[str], old: bool = False) -> list[str]:
    """ttft against the best of today's baselines at each speed (``old``: of the rules they
    replaced)."""
    base = [n for n in names if n != OURS and (n in OLD_BASELINES) == old]
    if not base:
        return ["no baseline run: nothing to check ttft against"]
    lines, ok = [], True
    for s, pt in sorted(points.items()):
        ours = pt[OURS]
        ratios = {q: ours[q] / min(pt[b][q] for b in base) for q in ("ttft_p50", "ttft_p99")} | {
            "hit_rate": ours["hit_rate"] / max(pt[b]["hit_rate"] for b in base)
        }
        good = ratios["ttft_p50"] <= 1.0 and ratios["ttft_p99"] <= 1.0
        good = good and ratios["hit_rate"] >= 0.97
        ok = ok and good
        lines.append(
            f"| {s:g} | x{ratios['ttft_p50']:.2f} | x{ratios['ttft_p99']:.2f} | "
            f"x{ratios['hit_rate']:.3f} | {'met' if good else 'NOT met'} |"
        )
    rates = {n: sustainable(points, n) for n in names}
    best_base = max((rates[b] or 0.0) for b in base)
    ok_rate = (rates[OURS] or 0.0) >= best_base
    head = [
        "| speedup | ttft p50 / best | p99 / best | hit / best | target |",
        "|---|---|---|---|---|",
    ]
    tail = [
        "",
        "sustainable rate (p50 <= 2x the bound's): "
        + ", ".join(f"{n} {rates[n] if rates[n] is not None else '<grid'}" for n in names),
        f"ttft {'>=' if ok_rate else '<'} the best baseline's ({best_base:g}); per-speed "
        f"targets {'all met' if ok else 'not all met'}",
    ]
    return head + lines + tail


def table(points: dict[float, dict[str, dict]], names: list[str], admission: bool) -> str:
    cols = " | ".join(
        f"{n} p50 / p99 s, hit, goodput" + (", refused" if admission else "") for n in names
    )
    lines = [f"| speedup | bound p50 s | {cols} |", "|---" * (len(names) + 2) + "|"]
    for s, pt in sorted(points.items()):
        cells = []
        for n in names:
            v = pt[n]
            c = f"{v['ttft_p50']:.2f} / {v['ttft_p99']:.2f}, {v['hit_rate']:.3f}"
            c += f", {v.get('goodput', math.nan):.3f}"
            cells.append(c + (f", {v['refused']:.0f}" if admission else ""))
        b = next(iter(pt.values()))["bound_p50"]
        lines.append(f"| {s:g} | {b:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(points: dict[float, dict[str, dict]], names: list[str], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    xs = sorted(points)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharex=True)
    for ax, q in zip(axes, ("ttft_p50", "ttft_p99"), strict=True):
        for n in names:
            ax.plot(
                xs, [points[s][n][q] for s in xs], marker="o", label=n, lw=2 if n == OURS else 1
            )
        bound = [points[s][names[0]][f"bound_{q[-3:]}"] for s in xs]
        ax.plot(xs, bound, "k--", label="bound")
        if q == "ttft_p50":
            ax.plot(xs, [2 * b for b in bound], "k:", label="2x bound (sustainable)")
        ax.set_yscale("log")
        ax.set_xlabel("offered load (speedup of the trace's arrivals)")
        ax.set_ylabel(f"TTFT {q[-3:]} (s)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--workload",
        default="mooncake",
        help="mooncake, multiturn_chat, hot_prefix, azure_conv, azure_code",
    )
    p.add_argument("--speedups", default="1,1.5,2,2.5,3,3.5,4,4.5,5,5.5,6")
    p.add_argument("--seeds", type=int, default=1, help="seeds per point (medians reported)")
    p.add_argument(
        "--policies",
        default=",".join([OURS, *BASELINES]),
        help=f"comma-separated; add {','.join(OLD_BASELINES)} for the rules today's peers replaced",
    )
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--pages", type=int, default=8192)
    p.add_argument("--timing", default="cpu")
    p.add_argument(
        "--max-batch-tokens",
        type=int,
        default=0,
        help="the workers' step budget (0: the timing preset's, 512 for cpu)",
    )
    p.add_argument(
        "--prefill-order",
        default=SimConfig.prefill_order,
        choices=PREFILL_ORDERS,
        help="the workers' prefill order (default: the engine's)",
    )
    p.add_argument(
        "--ours",
        default=OURS,
        help="the policy spec run as ttft (e.g. ttft:margin=0; the table still says ttft)",
    )
    p.add_argument("--limit", type=int, default=None, help="the first N requests")
    p.add_argument(
        "--admission",
        action="store_true",
        help=f"refuse arrivals as the live router does ({ADMISSION[0]} in flight, "
        f"{ADMISSION[1]} on every worker, or a {ADMISSION[2]:g} s queue) and report the refused",
    )
    p.add_argument(
        "--baselines-from",
        default=None,
        help="an earlier --out JSON of the same sweep: take the policies it has from it",
    )
    p.add_argument(
        "--slo",
        type=float,
        default=10.0,
        help="goodput's SLO: the share of arrivals with a first token within this many seconds "
        "(refused requests count as missed)",
    )
    p.add_argument("--jobs", type=int, default=1, help="points run in parallel processes")
    p.add_argument("--out", default="/tmp/bench_sim_load.json")
    p.add_argument("--plot", default="benchmarks/bench_sim_load.png")
    p.add_argument(
        "--quick", action="store_true", help="a smoke run: 4 x 2048, 300 requests, speedups 2,4"
    )
    args = p.parse_args(argv)
    if args.quick:
        args.workers, args.pages, args.speedups, args.plot = 4, 2048, "2,4", ""
        args.limit = args.limit or 300
    names = args.policies.split(",")
    if OURS not in names:
        p.error(f"--policies must include {OURS}")
    stored = stored_points(args.baselines_from)
    points = run_all(args, names, stored)
    title = (
        f"{args.workload}, {args.workers} workers x {args.pages} pages, {args.timing} timing"
        f"{f', {args.max_batch_tokens}-token steps' if args.max_batch_tokens else ''}, "
        f"{args.prefill_order} workers, "
        f"{args.seeds} seed(s){', admission modelled' if args.admission else ''}"
    )
    print(f"#### {title}\n\n{table(points, names, args.admission)}\n")
    print("against today's peers:\n" + "\n".join(verdict(points, names)))
    if any(n in OLD_BASELINES for n in names):
        print("\nagainst the rules they replaced:\n" + "\n".join(verdict(points, names, old=True)))
    if args.plot:
        plot(points, names, args.plot, title)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        meta = {"date": date.today().isoformat(), "argv": sys.argv, "machine": platform.machine()}
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "points": {str(k): v for k, v in points.items()}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
