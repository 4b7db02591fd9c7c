"""Two policies' live runs compared at the same machine speed.

Past saturation a live run's TTFT is set as much by how fast the shared machine computed that
run as by the policy: the work (prefill and decode tokens, hence engine steps) is the same, but
each step's period moves by 10-20% from run to run on this host, and TTFT moves with it about
three times over (its elasticity to the step period, fitted below). Two-target sets of a few
runs then differ by 1.1-1.5x in p50 whichever policy is better. This reads the reports of
``bench_serving.py ... --step-logs`` (each run's step period is its machine speed) and fits, over
every run of the two targets,

    log(metric) = a + b * log(step period) + c * [run is the first target's]

so ``exp(c)`` is the first target's metric over the second's at the same step period, with a 95%
confidence interval from the fit's residuals (Student's t). The runs and the fit are plotted.

    .venv/bin/python benchmarks/studies/live_speed_adjusted.py REPORT.json [REPORT.json ...] \\
        [--targets radixray:ttft radixray:cache_aware] [--workload mooncake] [--plot out.png]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile

import numpy as np

from radixray.bench.counters import step_totals

METRICS = ("ttft_p50_s", "ttft_mean_s", "ttft_p99_s", "hit_rate", "throughput_rps")

# Student's t, two-sided 95% (0.975 quantile), by degrees of freedom
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306}
_T975 |= {9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042, 60: 2.000}


def t975(dof: int) -> float:
    """The 0.975 quantile of Student's t (the nearest tabulated dof at or below; 1.96 past)."""
    if dof < 1:
        raise ValueError(f"dof must be >= 1, got {dof}")
    if dof > 60:
        return 1.96
    return _T975[max(d for d in _T975 if d <= dof)]


def runs_of(report: dict, workload: str, target: str) -> list[dict]:
    """One dict per run of ``target``: its step period and the METRICS (mean TTFT from the
    run's requests when the report predates ``ttft_mean_s``)."""
    w = report["workloads"][workload]
    policy = target.partition(":")[2]
    (row,) = [r for r in w["rows"] if f"{r['router']}:{r['policy']}" == target]
    repeats = row["per_repeat"]
    requests = w["requests"][target]
    per_run = len(requests) // len(repeats)
    out = []
    for i, rep in enumerate(repeats):
        step = rep.get("step_period_ms")
        if step is None:
            logs = w.get("step_logs", {}).get(target)
            if not logs:
                raise SystemExit(f"{target}: no step logs in the report (run with --step-logs)")
            step = step_totals(logs[i])["step_period_ms"]
        run = {"policy": policy, "step_period_ms": step} | {k: rep.get(k) for k in METRICS}
        if run["ttft_mean_s"] is None:
            ttfts = [r["ttft_s"] for r in requests[i * per_run : (i + 1) * per_run] if r["ok"]]
            run["ttft_mean_s"] = sum(ttfts) / len(ttfts)
        out.append(run)
    return out


def adjusted_ratio(first: list[dict], second: list[dict], metric: str) -> dict:
    """``exp(c)`` of the fit above for ``metric``, its 95% interval, the elasticity ``b`` and
    the intercept ``a``."""
    runs = [(r, 1.0) for r in first] + [(r, 0.0) for r in second]
    x = np.array([[1.0, math.log(r["step_period_ms"]), d] for r, d in runs])
    y = np.array([math.log(r[metric]) for r, _ in runs])
    dof = len(y) - 3
    if dof < 1:
        raise ValueError(f"need at least 4 runs in all, got {len(y)}")
    (a, b, c), *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ np.array([a, b, c])
    cov = (resid @ resid / dof) * np.linalg.inv(x.T @ x)
    half = t975(dof) * math.sqrt(cov[2, 2])
    return {
        "ratio": math.exp(c),
        "low": math.exp(c - half),
        "high": math.exp(c + half),
        "elasticity": float(b),
        "intercept": float(a),
        "runs": len(y),
    }


def plot(first, second, names, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, metric in zip(axes, ("ttft_p50_s", "ttft_mean_s", "ttft_p99_s"), strict=True):
        fit = adjusted_ratio(first, second, metric)
        steps = [r["step_period_ms"] for r in first + second]
        grid = np.linspace(min(steps), max(steps), 20)
        base = np.exp(fit["intercept"] + fit["elasticity"] * np.log(grid))
        for runs, name, marker, level in (
            (first, names[0], "o", fit["ratio"]),
            (second, names[1], "s", 1.0),
        ):
            xs, ys = [r["step_period_ms"] for r in runs], [r[metric] for r in runs]
            dots = ax.scatter(xs, ys, marker=marker)
            # the target's fitted line: the shared elasticity, its own level
            ax.plot(grid, base * level, color=dots.get_facecolor()[0], label=f"{name}")
        ax.set_xlabel("engine step period (ms): the machine's speed in the run")
        ax.set_ylabel(metric.replace("_s", " (s)").replace("_", " "))
        ax.set_title(f"{metric}: x{fit['ratio']:.2f} ({fit['low']:.2f}-{fit['high']:.2f})")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def _quick_report(out: str, targets: list[str]) -> None:
    from radixray.bench.bench_cli import main as bench

    args = ["compare", "--workloads", "mooncake", "--targets", *targets, "--workers", "2"]
    args += ["--repeats", "2", "--mooncake-requests", "16", "--mooncake-rate", "8"]
    args += ["--probe-requests", "0", "--no-progress", "--step-logs", "--out-dir", out]
    if bench(args) != 0:
        raise SystemExit("the quick compare run failed")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("reports", nargs="*")
    p.add_argument("--targets", nargs=2, default=["radixray:ttft", "radixray:cache_aware"])
    p.add_argument("--workload", default="mooncake")
    p.add_argument("--plot", default=None, help="write the runs and the fitted lines here")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: two runs of each target on two tiny workers, then the fit",
    )
    args = p.parse_args(argv)
    if args.quick:
        with tempfile.TemporaryDirectory() as tmp:
            _quick_report(tmp, args.targets)
            return main([f"{tmp}/bench_serving.json", "--targets", *args.targets])
    if not args.reports:
        p.error("give at least one report (bench_serving.py --step-logs --out-dir DIR)")
    first, second = [], []
    for path in args.reports:
        report = json.loads(open(path).read())
        first += runs_of(report, args.workload, args.targets[0])
        second += runs_of(report, args.workload, args.targets[1])
    print("| target | step period (ms) | TTFT p50 / mean / p99 (s) | hit | req/s |")
    print("|---|---|---|---|---|")
    for r in first + second:
        print(
            f"| {r['policy']} | {r['step_period_ms']:.2f} | {r['ttft_p50_s']:.2f} / "
            f"{r['ttft_mean_s']:.2f} / {r['ttft_p99_s']:.2f} | {r['hit_rate']:.1%} "
            f"| {r['throughput_rps']:.2f} |"
        )
    print(f"\n{args.targets[0]} over {args.targets[1]} at the same step period (95% interval):\n")
    for metric in METRICS:
        if min(r[metric] for r in first + second) <= 0:
            print(f"- {metric}: a run has none (no fit of a log)")
            continue
        f = adjusted_ratio(first, second, metric)
        print(
            f"- {metric}: x{f['ratio']:.3f} ({f['low']:.3f}-{f['high']:.3f}), elasticity to "
            f"the step period {f['elasticity']:.2f}, {f['runs']} runs"
        )
    if args.plot:
        plot(first, second, args.targets, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
