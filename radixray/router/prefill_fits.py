"""Each worker's prefill step cost ``(overhead_s, tokens_per_s)`` and decode cost, pooled over
its class.

Workers of one performance class (their ``info.perf_class``: same model, dtype, device type and
threads) share one fit over all their reported steps (``radixray.step_cost``), so the router
compares their load and cache, not the noise between their separate fits. A worker that reports
no class or no moments keeps its own fit; one with no measurement yet borrows the mean rate of
those that have one, else a nominal prior, so a new worker is neither shunned nor flooded.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from radixray.step_cost import PRIOR_PREFILL_TPS, pooled_decode_seq_s, pooled_fits

if TYPE_CHECKING:
    from .worker_pool import WorkerEntry

__all__ = ["pooled_decode_costs", "pooled_prefill_fits", "PRIOR_PREFILL_TPS"]


def pooled_prefill_fits(entries: Iterable[WorkerEntry]) -> dict[str, tuple[float, float]]:
    """Each entry's fit from its last report (``radixray.step_cost.pooled_fits``)."""
    return pooled_fits(
        (
            e.worker_id,
            e.info.perf_class or None,
            e.report.prefill_fit_moments,
            (e.report.prefill_overhead_s or 0.0, e.report.prefill_tokens_per_s)
            if e.report.prefill_tokens_per_s
            else None,
        )
        for e in entries
    )


def pooled_decode_costs(entries: Iterable[WorkerEntry]) -> dict[str, float]:
    """Each entry's decode cost, seconds one more sequence adds to a decode step, pooled per
    class the same way (``radixray.step_cost.pooled_decode_seq_s``; 0: not known yet)."""
    return pooled_decode_seq_s(
        (e.worker_id, e.info.perf_class or None, e.report.decode_fit_moments) for e in entries
    )
