"""Plots of simulator runs: hit rate per policy, TTFT CDF, per-worker busy time."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from radixray.plots import ttft_cdf

from .results import REFUSED, RunResult

__all__ = ["plot_results"]


def plot_results(results: Mapping[str, RunResult], path: str | Path | None = None, title=""):
    """Three panels; saved to ``path`` when given (PNG by extension). Returns the figure."""
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.2))
    names = list(results)
    sums = {k: r.summary() for k, r in results.items()}
    hits = [sums[k]["hit_rate"] for k in names]
    ax1.bar(names, hits, color="tab:blue", label="hit rate")
    ax1.bar(
        names,
        [sums[k]["hit_rate_beyond_first_block"] for k in names],
        color="tab:cyan",
        width=0.4,
        label="beyond block 0",
    )
    if names:
        ax1.axhline(sums[names[0]]["ceiling"], color="k", ls="--", lw=1, label="ceiling")
    ax1.set_ylabel("prompt tokens reused")
    ax1.set_title("Cache hit rate")
    ax1.tick_params(axis="x", rotation=30)
    ax1.legend(fontsize=8)
    served = {k: [r.ttft for r in results[k].records if r.reason != REFUSED] for k in names}
    ttft_cdf(ax2, served, "s", "simulated")
    ax2.set_title("TTFT CDF")
    width = 0.8 / max(len(names), 1)
    for j, k in enumerate(names):
        busy = results[k].busy_time
        ax3.bar([i + j * width for i in range(len(busy))], busy, width=width, label=k)
    ax3.set_xlabel("worker")
    ax3.set_ylabel("busy time (s)")
    ax3.set_title("Per-worker load")
    ax3.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=80)
    return fig
