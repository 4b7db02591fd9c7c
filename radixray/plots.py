"""Plot pieces the simulator's and the live benchmark's figures share (matplotlib axes in, drawn
on; matplotlib is imported by the caller)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["ttft_cdf"]


def ttft_cdf(ax, series: Mapping[str, Sequence[float]], unit: str = "s", what: str = "") -> None:
    """One TTFT CDF per label (``series``: label -> seconds), log x axis."""
    if unit not in ("s", "ms"):
        raise ValueError(f"unit must be 's' or 'ms', got {unit!r}")
    scale = 1000.0 if unit == "ms" else 1.0
    for label, ttfts in series.items():
        xs = sorted(t * scale for t in ttfts)
        if xs:
            ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=label)
    ax.set_xscale("log")
    ax.set_xlabel(f"TTFT ({unit}{', ' + what if what else ''}, log)")
    ax.set_ylabel("fraction of requests")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
