"""Summaries, JSON, the markdown table and the plot of a benchmark."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from radixray.numbers import percentile
from radixray.plots import ttft_cdf

from .counters import step_totals
from .loadgen import RunResult

__all__ = [
    "summarize",
    "markdown_table",
    "breakdown_table",
    "tier_table",
    "median_table",
    "write_json",
    "plot",
]


def summarize(run: RunResult, counters: dict | None = None) -> dict:
    """One row of the report: latency percentiles, throughput, hit rates, errors."""
    ok = [r for r in run.requests if r.ok]
    ttft = [r.ttft_s for r in ok]
    e2e = [r.e2e_s for r in ok]
    itl = [x for r in ok for x in r.itl_s]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    shared = sum(min(r.shared_prefix_tokens, r.prompt_tokens) for r in ok)
    beyond = sum(max(0, r.cached_tokens - r.shared_prefix_tokens) for r in ok)
    out_tokens = sum(r.completion_tokens for r in ok)
    span = max((r.start_s + (r.e2e_s or 0.0) for r in ok), default=0.0)
    errors: dict[str, int] = {}
    for r in run.requests:
        if not r.ok:
            key = (r.error or "unknown")[:80]
            errors[key] = errors.get(key, 0) + 1
    workers: dict[str, int] = {}
    for r in ok:
        if r.worker:
            workers[r.worker] = workers.get(r.worker, 0) + 1
    row = {
        "target": run.target,
        "requests": len(run.requests),
        "ok": len(ok),
        "errors": len(run.requests) - len(ok),
        # refused by admission (429 + Retry-After): a policy must not win by refusing more
        "refused": sum(1 for r in run.requests if r.status == 429),
        "error_kinds": errors,
        "duration_s": run.duration_s,
        "throughput_rps": len(ok) / span if span else 0.0,
        "output_tps": out_tokens / span if span else 0.0,
        "ttft_mean_s": sum(ttft) / len(ttft) if ttft else None,
        "ttft_p50_s": percentile(ttft, 50, None),
        "ttft_p90_s": percentile(ttft, 90, None),
        "ttft_p99_s": percentile(ttft, 99, None),
        "itl_p50_s": percentile(itl, 50, None),
        "itl_p99_s": percentile(itl, 99, None),
        "e2e_p50_s": percentile(e2e, 50, None),
        "e2e_p99_s": percentile(e2e, 99, None),
        "prompt_tokens": prompt,
        "client_cached_tokens": cached,
        "client_hit_rate": cached / prompt if prompt else 0.0,
        "hit_rate_beyond_shared": beyond / (prompt - shared) if prompt > shared else 0.0,
        "requests_per_worker": workers,
    }
    # Where the time and the hits go: recomputed work, TTFT of hits vs misses, skew, eviction.
    hit_reqs = [r.ttft_s for r in ok if r.cached_tokens > r.shared_prefix_tokens]
    miss_reqs = [r.ttft_s for r in ok if r.cached_tokens <= r.shared_prefix_tokens]
    row["uncached_tokens_per_request"] = (prompt - cached) / len(ok) if ok else 0.0
    row["ttft_p50_hit_s"] = percentile(hit_reqs, 50, None)
    row["ttft_p50_miss_s"] = percentile(miss_reqs, 50, None)
    row["max_worker_share"] = max(workers.values()) / len(ok) if workers and ok else None
    if counters is not None:
        row["worker_counters"] = counters
        row["hit_rate"] = counters["total"]["hit_rate"]
        total = counters["total"]
        row["evicted_miss_tokens"] = total["miss_tokens"].get("evicted", 0)
        row["evicted_pages"] = total["evicted_pages"]
        # the reused prompt tokens by tier: device-cache hits, pages loaded back from the host tier
        prompt_total = total["prompt_tokens"]
        for key, cause in (("device_hit_rate", "cached"), ("host_load_rate", "host")):
            n = total["miss_tokens"].get(cause, 0)
            row[key] = n / prompt_total if prompt_total else 0.0
        if counters.get("steps"):  # the step logs were kept: the machine's speed in this run
            row["step_period_ms"] = step_totals(counters["steps"])["step_period_ms"]
    return row


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def markdown_table(rows: Sequence[dict]) -> str:
    """Router | policy | hit rate (workers) | TTFT p50/p99 | throughput | added latency p50."""
    head = (
        "| router | policy | cluster hit rate | hit rate beyond shared block | TTFT p50 (ms) "
        "| TTFT p99 (ms) | ITL p50 (ms) | throughput (req/s) | added latency p50 (ms) | errors |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        added = r.get("added_latency_p50_s")
        hit = r.get("hit_rate")
        lines.append(
            f"| {r.get('router', '-')} | {r.get('policy', '-')} "
            f"| {'-' if hit is None else f'{hit:.1%}'} "
            f"| {r['hit_rate_beyond_shared']:.1%} "
            f"| {_ms(r['ttft_p50_s'])} | {_ms(r['ttft_p99_s'])} | {_ms(r['itl_p50_s'])} "
            f"| {r['throughput_rps']:.2f} "
            f"| {'-' if added is None else f'{added * 1000:+.2f}'} | {r['errors']} |"
        )
    return head + "\n".join(lines) + "\n"


def breakdown_table(rows: Sequence[dict]) -> str:
    """Per target: recomputed prompt tokens per request, TTFT of requests that hit beyond the
    shared block vs those that did not, the busiest worker's share, tokens missed because an
    earlier copy had been evicted."""
    head = (
        "| router | policy | uncached tokens / request | TTFT p50 hit (ms) | TTFT p50 miss (ms) "
        "| busiest worker's share | evicted-miss tokens |\n|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        share = r.get("max_worker_share")
        lines.append(
            f"| {r.get('router', '-')} | {r.get('policy', '-')} "
            f"| {r['uncached_tokens_per_request']:.0f} | {_ms(r['ttft_p50_hit_s'])} "
            f"| {_ms(r['ttft_p50_miss_s'])} | {'-' if share is None else f'{share:.0%}'} "
            f"| {r.get('evicted_miss_tokens', '-')} |"
        )
    return head + "\n".join(lines) + "\n"


def tier_table(rows: Sequence[dict]) -> str:
    """Per target: where the reused prompt tokens came from (device hits, host-tier loads), the
    TTFT percentiles, tokens recomputed because their copy was gone, refused (429) and failed."""
    head = (
        "| router | policy | hit rate | device hits | host loads | TTFT p50 (ms) | TTFT p99 (ms) "
        "| throughput (req/s) | evicted-miss tokens | refused (429) | errors |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        hit, dev, host = (r.get(k) for k in ("hit_rate", "device_hit_rate", "host_load_rate"))
        lines.append(
            f"| {r.get('router', '-')} | {r.get('policy', '-')} "
            + "".join(f"| {'-' if x is None else f'{x:.1%}'} " for x in (hit, dev, host))
            + f"| {_ms(r['ttft_p50_s'])} | {_ms(r['ttft_p99_s'])} | {r['throughput_rps']:.2f} "
            f"| {r.get('evicted_miss_tokens', '-')} | {r['refused']} | {r['errors']} |"
        )
    return head + "\n".join(lines) + "\n"


def _median(xs: list) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


def median_table(rows: Sequence[dict]) -> str:
    """Per target, the median over its repeats (``row["per_repeat"]``) of hit rate (device
    hits + host loads), TTFT p50/p99 (the client's; the radixray router's own from routing to
    the first chunk beside it) and throughput; refused and failed requests summed; the
    machine's load average at the runs' starts (min-max): a shared machine's noise in view."""
    head = (
        "| router | policy | runs | hit rate | host loads | TTFT p50 (ms) | TTFT p99 (ms) "
        "| router-side TTFT p50 (ms) | throughput (req/s) | refused (429) | errors | load avg |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        reps = r.get("per_repeat") or []
        med = {k: _median([x.get(k) for x in reps]) for k in reps[0]} if reps else {}
        hit, host = med.get("hit_rate"), med.get("host_load_rate")
        loads = [x["load_avg"] for x in reps if x.get("load_avg") is not None]
        tput = med.get("throughput_rps")
        lines.append(
            f"| {r.get('router', '-')} | {r.get('policy', '-')} | {len(reps)} "
            + "".join(f"| {'-' if x is None else f'{x:.1%}'} " for x in (hit, host))
            + f"| {_ms(med.get('ttft_p50_s'))} | {_ms(med.get('ttft_p99_s'))} "
            f"| {_ms(med.get('router_ttft_p50_s'))} "
            f"| {'-' if tput is None else f'{tput:.2f}'} "
            f"| {sum(x.get('refused') or 0 for x in reps)} "
            f"| {sum(x.get('errors') or 0 for x in reps)} "
            f"| {f'{min(loads):.1f}-{max(loads):.1f}' if loads else '-'} |"
        )
    return head + "\n".join(lines) + "\n"


def write_json(path: str | Path, payload: dict) -> None:
    Path(path).write_text(json.dumps(payload, indent=1, default=str))


def plot(path: str | Path, by_workload: dict[str, list[tuple[str, list[float], float | None]]]):
    """One row per workload: TTFT CDF per target (left), cluster hit rate per target (right).
    ``by_workload[name] = [(target label, ttfts in s, hit rate or None), ...]``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(1, len(by_workload))
    fig, axes = plt.subplots(n, 2, figsize=(12, 4 * n), squeeze=False)
    for row, (name, series) in enumerate(by_workload.items()):
        ax, bx = axes[row]
        ttft_cdf(ax, {label: ttfts for label, ttfts, _ in series}, "ms")
        ax.set_title(f"{name}: TTFT CDF")
        labels = [s[0] for s in series if s[2] is not None]
        hits = [s[2] * 100 for s in series if s[2] is not None]
        bx.bar(range(len(hits)), hits, color="tab:green")
        bx.set_xticks(range(len(hits)), labels, rotation=30, ha="right", fontsize=8)
        bx.set_ylabel("cluster hit rate (%)")
        bx.set_title(f"{name}: cached / prompt tokens (worker counters)")
        for i, h in enumerate(hits):
            bx.text(i, h, f"{h:.1f}", ha="center", va="bottom", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
