"""Live sweeps across the regime (issue 44): ttft against SGLang's gateway (smg) below, at and past
the fleet's sustainable rate, each cell run ``--repeats`` times in alternating target order.

Each cell is one ``radixray bench compare`` run (``bench_serving.py``): Mooncake at rising
arrival rates (open loop, workers on a 4-token step budget so that four tiny-model workers
saturate at a rate the router still serves: ~6 req/s with the four workers on one core, ~20
with every process on two) and MT-Bench at rising
numbers of chat users (closed loop). ``--router-cpus 0 --worker-cpus 1`` puts the router under
test on a core of its own and the workers with the load generator on the other, as a deployment
places a router; without them every process runs anywhere (the layout of earlier runs).

The summary, per cell and target, is the median over the repeats with the range: cluster hit
rate, TTFT p50 and p99, and **goodput**, the share of the requests offered (refused and failed
ones included) whose first token came within ``--slo`` seconds; refusals pooled.

    .venv/bin/python benchmarks/studies/live_regimes.py --out /tmp/live \\
        --router-cpus 0 --worker-cpus 1                 # the grid below, ~50 min on 2 cores
    .venv/bin/python benchmarks/studies/live_regimes.py --summarize /tmp/live   # tables only
    .venv/bin/python benchmarks/studies/live_regimes.py --quick --out /tmp/q    # a smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
TARGETS = ["radixray:ttft", "smg:cache_aware"]
MOONCAKE = [
    "--workloads", "mooncake", "--max-batch-tokens", "4", "--mooncake-requests", "1174",
    "--max-requests", "2000",
]  # fmt: skip


def cells(args) -> list[tuple[str, list[str]]]:
    """(cell name, bench_serving flags) for every cell of the grid."""
    out = [(f"mooncake@{r:g}", [*MOONCAKE, "--mooncake-rate", f"{r:g}"]) for r in args.rates]
    out += [
        (f"mtbench@{c}", ["--workloads", "mtbench", "--mtbench-concurrency", str(c)])
        for c in args.users
    ]
    return out


def run(args) -> None:
    layout = []
    if args.router_cpus:
        layout += ["--router-cpus", args.router_cpus]
    if args.worker_cpus:
        layout += ["--worker-cpus", args.worker_cpus]
    for name, flags in cells(args):
        cmd = [sys.executable, str(HERE / "bench_serving.py"), *flags, *layout]
        cmd += ["--targets", *args.targets, "--repeats", str(args.repeats)]
        cmd += ["--max-duration", f"{args.duration:g}", "--probe-requests", "0", "--no-progress"]
        cmd += ["--out-dir", str(Path(args.out) / name), *args.extra]
        print(f"== {name}", flush=True)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def _span(xs: list[float], fmt: str) -> str:
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def summarize(root: Path, slo: float) -> str:
    lines = [
        f"| cell | target | hit rate | TTFT p50 (ms) | TTFT p99 (ms) | goodput (TTFT <= {slo:g} s)"
        " | refused | layout |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for path in sorted(root.glob("*/bench_serving.json"), key=_cell_order):
        report = json.loads(path.read_text())
        cores = report.get("layout", {}).get("router_cpus")
        layout = f"router on {cores}" if cores else "shared"
        for wl in report["workloads"].values():
            for row, target in zip(wl["rows"], report["targets"], strict=True):
                reps = row["per_repeat"]
                reqs = wl["requests"][target]
                good = sum(1 for r in reqs if r["ok"] and r["ttft_s"] <= slo) / max(1, len(reqs))
                lines.append(
                    f"| {path.parent.name} | {target} | "
                    f"{_span([r['hit_rate'] for r in reps], '{:.1%}')} | "
                    f"{_span([1000 * r['ttft_p50_s'] for r in reps], '{:,.0f}')} | "
                    f"{_span([1000 * r['ttft_p99_s'] for r in reps], '{:,.0f}')} | "
                    f"{good:.1%} | {sum(r['refused'] for r in reps)} | {layout} |"
                )
    return "\n".join(lines)


def _cell_order(path: Path) -> tuple:
    name, _, level = path.parent.name.partition("@")
    digits = "".join(c for c in level if c.isdigit() or c == ".")
    return name, float(digits or 0), level


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default="/tmp/live_regimes")
    p.add_argument("--summarize", default=None, help="print the tables of an earlier --out")
    p.add_argument("--targets", nargs="+", default=TARGETS)
    p.add_argument("--rates", type=float, nargs="*", default=[3, 6, 10], help="Mooncake req/s")
    p.add_argument("--users", type=int, nargs="*", default=[2, 8, 32], help="MT-Bench users")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--duration", type=float, default=30.0, help="seconds of load per run")
    p.add_argument("--router-cpus", default="", help="e.g. 0")
    p.add_argument("--worker-cpus", default="", help="e.g. 1")
    p.add_argument("--slo", type=float, default=1.0, help="goodput's TTFT bound, seconds")
    p.add_argument("--quick", action="store_true", help="a smoke run: one tiny cell, seconds")
    args, extra = p.parse_known_args(argv)
    args.extra = extra
    if args.summarize:
        print(summarize(Path(args.summarize), args.slo))
        return 0
    if args.quick:
        args.rates, args.users, args.repeats, args.duration = [4], [], 1, 3
        args.targets = ["radixray:ttft"]
        args.extra += ["--workers", "2", "--mooncake-requests", "12"]
    run(args)
    print(summarize(Path(args.out), args.slo))
    return 0


if __name__ == "__main__":
    sys.exit(main())
