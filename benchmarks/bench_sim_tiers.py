"""Host tiers in the routing simulator (issue 24): time-priced ttft against tier-blind routing and
the fixed-weight rules, and a host tier against an all-device cache of the same total pages.

Three clusters of the same workers: ``D`` device pages each; ``D`` device + ``H`` host pages each;
``D + H`` device pages each (the ceiling of a free load-back). On the tiered cluster, ttft
(host copies priced in load time), ttft with the tier invisible (``ttft:tiers=false``), and
kv_cost with a host block weighed 0.75 (Dynamo's default) and 0.8 (llm-d's), and cache_aware
(SGLang's rule, which sees the device tier only); ttft alone on the
other two. Each row: hit rate, share of prompt tokens loaded back from a host tier, TTFT excess
over the infinite-cache bound and over the pooled-cache reference (one LRU cache of the
cluster's whole capacity, device + host) at p50 / p99, and the per-request delay at p90.

Checks the issue's capacity targets (tiered ttft's hit >= 0.95x and excess <= 1.2x the
all-device cluster's at p50 and p99; its excess below every other policy's on the tiered
cluster) and its placement target (excess over the pooled reference <= 0.5x the best
baseline's at p50 and p99, delay p90 <= 0.5x, hit >= 0.95x; the baselines: both kv_cost rules
and cache_aware), and prints which are met.

    .venv/bin/python benchmarks/bench_sim_tiers.py           # Mooncake, 512-token pages, gpu
    .venv/bin/python benchmarks/bench_sim_tiers.py --workload multiturn_chat --workers 4 \
        --pages 64 --host-pages 256 --page-size 16 --timing cpu
    .venv/bin/python benchmarks/bench_sim_tiers.py --seeds 0,1,2   # each seed, then medians
    .venv/bin/python benchmarks/bench_sim_tiers.py --merge s0.json,s1.json,s2.json  # the same,
        # from runs of one seed each (--seed N --out sN.json, in parallel processes)
    .venv/bin/python benchmarks/bench_sim_tiers.py --quick   # a smoke run (seconds)

The gpu preset prices the host-tier copies overlapped layer by layer with the forward (32 layers:
the CUDA engine copies on its own stream), the cpu preset in series; ``--overlap-layers 0``
prices them in series on either.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from datetime import date

from radixray.sim import (
    SimConfig,
    hot_prefix,
    load_mooncake,
    multiturn_chat,
    percentile,
    simulate,
    timing_preset,
)
from radixray.sim.results import REFUSED

OURS = "ttft"
BLIND = "ttft:tiers=false"
RULES = ["kv_cost:host_block_weight=0.75", "kv_cost:host_block_weight=0.8"]
BASELINES = [*RULES, "cache_aware"]  # cache_aware (SGLang's rule) sees the device tier only
KEYS = ("hit_rate", "excess_p50", "excess_p99", "pooled_excess_p50", "pooled_excess_p99",
        "delay_p90", "delay_p99", "pooled_hit_rate", "ttft_p50", "ttft_p99")  # fmt: skip
# The excess at p99 is a difference of two quantiles in a sparse tail (at real scale one
# request's rank moves TTFT's p99 by ~0.1 s): printed beside it, the same at p98.9 and p99.1
BAND = (98.9, 99.1)


CLUSTERS = ("tiered", "device", "all-device")  # D + H host, D device, D + H device pages


def runs(args) -> list[tuple[str, str, int, int]]:
    """(label, policy, device pages, host pages) of each run, in report order."""
    D, H = args.pages, args.host_pages
    tiered = [(f"{D} + {H} host", p, D, H) for p in (OURS, BLIND, *BASELINES)]
    rows = [*tiered, (f"{D} device", OURS, D, 0), (f"{D + H} device", OURS, D + H, 0)]
    kinds = [CLUSTERS[0]] * len(tiered) + list(CLUSTERS[1:])
    clusters = args.clusters.split(",") if args.clusters else CLUSTERS
    return [
        r
        for r, kind in zip(rows, kinds, strict=True)
        if kind in clusters and (not args.only or r[1] in args.only.split(","))
    ]


def run_all(args, seed: int) -> list[dict]:
    if args.workload == "multiturn_chat":
        wl = multiturn_chat(num_requests=args.limit or 3000, seed=seed)
    elif args.workload == "hot_prefix":
        wl = hot_prefix(num_requests=args.limit or 3000, seed=seed)
    else:
        wl = load_mooncake("mooncake", block_tokens=args.page_size, seed=seed)
    timing = timing_preset(args.timing, charge_demotions=not args.free_demotions)
    if args.overlap_layers is not None:  # else the preset's: gpu 32 layers, cpu in series
        timing = timing.with_(overlap_layers=args.overlap_layers)
    rows = []
    for label, policy, dev, host in runs(args):
        cfg = SimConfig(
            num_workers=args.workers,
            num_pages=dev,
            host_pages=host,
            host_write_through_hits=args.write_through,
            page_size=args.page_size,
            timing=timing,
            prefill_order=args.prefill_order,
            seed=seed,
        )
        t0 = time.perf_counter()
        row = row_of(label, policy, simulate(wl, policy, cfg), args.page_size)
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
        print(f"seed {seed} {label:>18} {policy:<32} hit {row['hit_rate']:.3f} "
              f"xs {row['excess_p50']:.3f}/{row['excess_p99']:.3f} "
              f"pages out/in {row['pages_to_host']}/{row['pages_from_host']} "
              f"({row['wall_s']:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
    return rows


def row_of(label: str, policy: str, r, page_size: int) -> dict:
    """One run's figures (``r``: its RunResult)."""
    s = r.summary()
    prompt = sum(x.prompt_tokens for x in r.records)
    loaded = r.host_copies.get("pages_from_host", 0) * page_size
    row = {"cluster": label, "policy": policy, **{k: s[k] for k in KEYS}}
    row["host_share"] = loaded / prompt if prompt else 0.0
    row["copy_s"] = r.host_copies.get("copy_seconds", 0.0)
    row["pages_to_host"] = r.host_copies.get("pages_to_host", 0)
    row["pages_from_host"] = r.host_copies.get("pages_from_host", 0)
    row["p99_requests"] = p99_breakdown(r)
    ttfts = [x.ttft for x in r.records if x.reason != REFUSED]
    for q in BAND:
        row[f"excess_p{q}"] = max(0.0, percentile(ttfts, q) - percentile(r.bound, q))
    return row


def p99_breakdown(r) -> dict[str, float]:
    """Means over the requests whose TTFT is at or above the run's p99: their TTFT, bound,
    prompt and cached tokens, and where the TTFT went (before their first step, their steps'
    forwards, the host-tier copies charged to those steps, between their steps)."""
    recs = sorted((x for x in r.records if not math.isnan(x.forward_s)), key=lambda x: x.ttft)
    bound = {x.rid: b for x, b in zip(r.records, r.bound, strict=True)}
    top = recs[int(0.99 * (len(recs) - 1)) :]
    keys = ("ttft", "prompt_tokens", "cached", "wait_s", "forward_s", "copy_s")
    out = {k: sum(getattr(x, k) for x in top) / len(top) for k in keys}
    out["bound"] = sum(bound[x.rid] for x in top) / len(top)
    out["between_s"] = out["ttft"] - out["wait_s"] - out["forward_s"] - out["copy_s"]
    out["n"] = len(top)
    return out


def breakdown_table(rows: list[dict]) -> str:
    cols = ("n", "prompt_tokens", "cached", "ttft", "bound", "wait_s", "forward_s", "copy_s",
            "between_s")  # fmt: skip
    lines = ["| cluster | policy | " + " | ".join(cols) + " |", "|---|---|" + "---:|" * len(cols)]
    for r in rows:
        b = r["p99_requests"]
        vals = [f"{b[c]:.0f}" if c in cols[:3] else f"{b[c]:.3f}" for c in cols]
        lines.append(f"| {r['cluster']} | {r['policy']} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def tail_table(rows: list[dict]) -> str:
    qs = (BAND[0], 99, BAND[1])
    lines = ["| cluster | policy | " + " | ".join(f"excess p{q} s" for q in qs)
             + " | delay p99 s |", "|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        xs = " | ".join(f"{r[f'excess_p{q}']:.3f}" for q in qs)
        lines.append(f"| {r['cluster']} | {r['policy']} | {xs} | {r['delay_p99']:.3f} |")
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    lines = [
        "| cluster (pages/worker) | policy | hit | loaded | excess p50 s | excess p99 s "
        "| vs pooled p50 s | vs pooled p99 s | delay p90 s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['cluster']} | {r['policy']} | {r['hit_rate']:.3f} | {r['host_share']:.3f} "
            f"| {r['excess_p50']:.3f} | {r['excess_p99']:.3f} | {r['pooled_excess_p50']:.3f} "
            f"| {r['pooled_excess_p99']:.3f} | {r['delay_p90']:.3f} |"
        )
    return "\n".join(lines)


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else (1.0 if a <= 0 else float("inf"))


def targets(rows: list[dict]) -> list[tuple[str, float, str, bool]]:
    """(what, measured ratio, target, met) for the issue's capacity and placement targets, those
    the rows allow (the tiered ttft row, and the all-device one or the tiered baselines)."""
    tiered = [r for r in rows if "host" in r["cluster"]]
    ours = next((r for r in tiered if r["policy"] == OURS), None)
    if ours is None:
        return []
    out = []
    ceiling = [r for r in rows if r["cluster"] == f"{_total(ours['cluster'])} device"]
    others = [r for r in tiered if r is not ours]
    for q in ("p50", "p99") if ceiling else ():
        if q == "p50":
            out.append(("hit vs all-device", _ratio(ours["hit_rate"], ceiling[0]["hit_rate"]),
                        ">= 0.95"))  # fmt: skip
        x = _ratio(ours[f"excess_{q}"], ceiling[0][f"excess_{q}"])
        out.append((f"excess {q} vs all-device", x, "<= 1.2"))
    for q in ("p50", "p99") if len(others) == len([BLIND, *BASELINES]) else ():
        best = min(r[f"excess_{q}"] for r in others)
        out.append((f"excess {q} vs best other on tiers", _ratio(ours[f"excess_{q}"], best), "< 1"))
    base = [r for r in tiered if r["policy"] in BASELINES]
    if len(base) == len(BASELINES):
        for key in ("pooled_excess_p50", "pooled_excess_p99", "delay_p90"):
            out.append((f"{key} vs best baseline",
                        _ratio(ours[key], min(r[key] for r in base)), "<= 0.5"))  # fmt: skip
        hit = _ratio(ours["hit_rate"], max(r["hit_rate"] for r in base))
        out.append(("hit vs best baseline", hit, ">= 0.95"))
    return [(w, x, t, _met(x, t)) for w, x, t in out]


def _total(label: str) -> int:
    """D + H of a tiered cluster's label ("2000 + 8000 host")."""
    d, _, h, _ = label.split()
    return int(d) + int(h)


def _met(x: float, target: str) -> bool:
    op, v = target.split()
    return {">=": x >= float(v), "<=": x <= float(v), "<": x < float(v)}[op]


def median_rows(per_seed: list[list[dict]]) -> list[dict]:
    """Each row's median over the seeds that ran it, field by field (the p99 requests' means
    too); ``seeds`` how many."""
    groups: dict[tuple, list[dict]] = {}
    for rows in per_seed:
        for r in rows:
            groups.setdefault((r["cluster"], r["policy"]), []).append(r)
    out = []
    for rows in groups.values():
        row = {k: v for k, v in rows[0].items() if isinstance(v, str)}
        for k, v in rows[0].items():
            if isinstance(v, int | float):
                row[k] = statistics.median(r[k] for r in rows)
        tail = [r["p99_requests"] for r in rows]
        row["p99_requests"] = {k: statistics.median(t[k] for t in tail) for k in tail[0]}
        row["seeds"] = len(rows)
        out.append(row)
    return out


def median_targets(per_seed: list[list[tuple]]) -> list[tuple[str, float, str, bool, list]]:
    """(what, median ratio over the seeds that measured it, target, met at the median, every
    such seed's ratio)."""
    groups: dict[str, list[tuple]] = {}
    for checks in per_seed:
        for c in checks:
            groups.setdefault(c[0], []).append(c)
    out = []
    for what, checks in groups.items():
        ratios = [c[1] for c in checks]
        x = statistics.median(ratios)
        out.append((what, x, checks[0][2], _met(x, checks[0][2]), ratios))
    return out


def report(rows: list[dict], checks: list[tuple], title: str) -> None:
    print(f"\n### {title}\n")
    print(table(rows))
    print("\nThe requests at or above the p99 of TTFT (means):\n")
    print(breakdown_table(rows))
    print("\nThe excess near p99 (a sparse tail: one request's rank moves it), and the delay:\n")
    print(tail_table(rows))
    print()
    for what, x, target, met, *seeds in checks:
        each = f" (seeds {' / '.join(f'{r:.2f}' for r in seeds[0])})" if seeds else ""
        print(f"- {what}: {x:.2f}x{each} (target {target}): {'met' if met else 'not met'}")


def _layers(args) -> int:
    if args.overlap_layers is not None:
        return args.overlap_layers
    return timing_preset(args.timing).overlap_layers


def merged(paths: str) -> tuple[list[int], list[list[dict]], dict]:
    """The seeds and their rows from files this script wrote with --out (runs of one or more
    seeds each, with the same clusters and policies: seeds run in parallel processes)."""
    by_seed, run_args = {}, {}
    for path in paths.split(","):
        with open(path) as f:
            data = json.load(f)
        for k, rows in data["seeds"].items():
            by_seed.setdefault(int(k), []).extend(rows)
        run_args = run_args or data["args"]
    seeds = sorted(by_seed)
    order = [(label, policy) for label, policy, *_ in runs(argparse.Namespace(**run_args
             | {"clusters": None, "only": None}))]  # fmt: skip
    for rows in by_seed.values():
        rows.sort(key=lambda r: order.index((r["cluster"], r["policy"])))
    return seeds, [by_seed[k] for k in seeds], run_args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.merge:  # the runs' own settings for the header
        seeds, per_seed, run_args = merged(args.merge)
        args = argparse.Namespace(**(run_args | {"merge": args.merge, "out": args.out}))
    else:
        seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
        per_seed = [run_all(args, seed) for seed in seeds]
    checks = [targets(rows) for rows in per_seed]
    print(f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, "
          f"{date.today()}; {args.workload}, {args.workers} workers, {args.page_size}-token pages, "
          f"timing {args.timing} (copies overlapped over {_layers(args)} layers; 0: in series), "
          f"{args.prefill_order} prefills, seeds {seeds}")  # fmt: skip
    for seed, rows, c in zip(seeds, per_seed, checks, strict=True):
        report(rows, c, f"seed {seed}")
    out = {"args": vars(args), "seeds": dict(zip(seeds, per_seed, strict=True))}
    if len(seeds) > 1:
        med, med_checks = median_rows(per_seed), median_targets(checks)
        report(med, med_checks, f"median over seeds {seeds}")
        out |= {"median": med, "targets": med_checks}
    else:
        out["targets"] = checks[0]
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="multiturn_chat, 400 requests, small pools")
    p.add_argument(
        "--workload", choices=("mooncake", "multiturn_chat", "hot_prefix"), default="mooncake"
    )
    p.add_argument("--limit", type=int, default=None, help="requests of a generated workload")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--pages", type=int, default=2000, help="device pages per worker")
    p.add_argument("--host-pages", type=int, default=8000, help="host pages per worker")
    p.add_argument("--page-size", type=int, default=512)
    p.add_argument("--timing", default="gpu")
    p.add_argument(
        "--prefill-order", default=SimConfig.prefill_order, help="the workers' (the engine's)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", help="comma-separated seeds: each seed's runs, then their medians")
    p.add_argument(
        "--free-demotions",
        action="store_true",
        help="demotions cost the step nothing (an engine that overlaps its write-back)",
    )
    p.add_argument(
        "--overlap-layers",
        type=int,
        default=None,
        metavar="L",
        help="copies overlapped layer by layer with a forward of L layers; 0: in series, copies "
        "then forward (default: the preset's, gpu 32 layers, cpu 0)",
    )
    p.add_argument(
        "--write-through",
        type=int,
        default=None,
        metavar="N",
        help="copy a device node to the host tier once hit N times (default: write-back only)",
    )
    p.add_argument(
        "--merge",
        metavar="FILES",
        help="run nothing: report the seeds of these --out files (comma-separated) and medians",
    )
    p.add_argument("--only", help="run only these policies (comma-separated)")
    p.add_argument(
        "--clusters",
        help=f"run only these clusters (comma-separated: {', '.join(CLUSTERS)}); the targets are "
        "checked where the runs allow",
    )
    p.add_argument("--out", help="write the rows and the targets as JSON here")
    args = p.parse_args(argv)
    if args.quick:
        args.workers, args.pages, args.host_pages, args.page_size = 4, 48, 192, 16
        args.timing, args.workload, args.limit = "cpu", "multiturn_chat", 400
    return args


if __name__ == "__main__":
    sys.exit(main())
