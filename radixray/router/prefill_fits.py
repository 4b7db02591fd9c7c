"""Each worker's prefill step cost ``(overhead_s, tokens_per_s)``, pooled over its class.

Workers of one performance class (their ``info.perf_class``: same model, dtype, device type and
threads) share one fit over all their reported steps (``radixray.step_cost``), so the router
compares their load and cache, not the noise between their separate fits. A worker that reports
no class or no moments keeps its own fit; one with no measurement yet borrows the mean rate of
those that have one, else a nominal prior, so a new worker is neither shunned nor flooded.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from radixray.step_cost import fit_moments, sum_moments

if TYPE_CHECKING:
    from .worker_pool import WorkerEntry

__all__ = ["pooled_prefill_fits", "PRIOR_PREFILL_TPS"]

# Before any worker has measured its prefill rate: a CPU worker on the default model is in the
# thousands of tokens/s range; only the ratio between workers matters to the policies.
PRIOR_PREFILL_TPS = 1000.0


def pooled_prefill_fits(entries: Iterable[WorkerEntry]) -> dict[str, tuple[float, float]]:
    entries = list(entries)
    groups: dict[object, list[WorkerEntry]] = {}
    for e in entries:
        groups.setdefault(e.info.perf_class or ("worker", e.worker_id), []).append(e)
    fits: dict[str, tuple[float, float]] = {}
    for members in groups.values():
        moments = [
            e.report.prefill_fit_moments for e in members if e.report.prefill_fit_moments[0] > 0
        ]
        pooled = fit_moments(sum_moments(moments)) if moments else None
        for e in members:
            r = e.report
            if pooled is not None:
                fits[e.worker_id] = pooled
            elif r.prefill_tokens_per_s:
                fits[e.worker_id] = (r.prefill_overhead_s or 0.0, r.prefill_tokens_per_s)
    prior = sum(rate for _, rate in fits.values()) / len(fits) if fits else PRIOR_PREFILL_TPS
    for e in entries:
        fits.setdefault(e.worker_id, (0.0, prior))
    return fits
