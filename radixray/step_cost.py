"""The prefill step-cost model shared by workers (which measure it) and routers (which pool it).

A worker fits ``step_seconds ~ overhead + tokens / rate`` over its recent prefill steps by
exponentially weighted least squares, ``step_seconds`` being each step's whole period (its
forward and the engine's work around it: what a queued request waits for, and what bounds the
rate a queue drains at; the forward alone read the capacity 16-18% high on the tiny CPU model).
The fit's sufficient statistics (five moments) travel in the worker's load report, so a router
can also fit one model over several workers of the same performance class: on identical
hardware, per-worker fits differ only by noise, and a router that compared them would route on
that noise (a few milliseconds of fitted overhead outweigh a cached prefix of a hundred tokens
on a small model).

Pure Python, no torch: the router imports it.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence

__all__ = [
    "PRIOR_PREFILL_TPS",
    "StepCostModel",
    "decode_seq_seconds",
    "fit_line",
    "fit_moments",
    "pooled_decode_seq_s",
    "pooled_fits",
    "queue_wait_seconds",
    "step_fixed_s",
    "sum_moments",
]

# Before any worker has measured its prefill rate: a CPU worker on the default model is in the
# thousands of tokens/s range; only the ratio between workers matters to the policies.
PRIOR_PREFILL_TPS = 1000.0


def fit_line(moments: Sequence[float]) -> tuple[float, float] | None:
    """(overhead seconds, units per second) from weighted moments ``(sum w, sum w*x, sum w*y,
    sum w*x^2, sum w*x*y)`` by least squares, or None when they cannot separate the two: no
    steps, too little spread in step sizes, or a fit that is not physical (negative overhead,
    non-positive slope)."""
    s0, sx, sy, sxx, sxy = moments
    if s0 <= 0 or sx <= 0:
        return None
    mean_x = sx / s0
    var_x = sxx / s0 - mean_x * mean_x
    if var_x <= (0.05 * mean_x) ** 2:  # too little spread in step sizes to separate the two
        return None
    slope = (sxy / s0 - mean_x * sy / s0) / var_x
    intercept = sy / s0 - slope * mean_x
    return (intercept, 1.0 / slope) if slope > 0 and intercept >= 0 else None


def fit_moments(moments: Sequence[float]) -> tuple[float, float] | None:
    """(overhead seconds, tokens per second) from weighted moments (``fit_line``), or None
    before any prefill step. Where ``fit_line`` cannot separate the two it falls back to the
    plain ratio with zero overhead."""
    fit = fit_line(moments)
    if fit is not None:
        return fit
    s0, sx, sy, _, _ = moments
    if s0 <= 0 or sx <= 0 or sy <= 0:
        return None
    return 0.0, sx / sy


def decode_seq_seconds(moments: Sequence[float]) -> float | None:
    """Seconds one more decoding sequence adds to a decode-only step: the slope of the step's
    period against its batch size (moments of ``(batch, seconds)``), or None while the batch
    sizes seen are too alike to tell it from the step's fixed cost. Unlike the prefill rate
    there is no ratio to fall back on: a step of one sequence is almost all fixed cost on a
    GPU, and charging it per sequence would price a decode at the whole step."""
    fit = fit_line(moments)
    return 1.0 / fit[1] if fit else None


def pooled_decode_seq_s(
    workers: Iterable[tuple[Hashable, Hashable | None, Sequence[float] | None]],
) -> dict[Hashable, float]:
    """Each worker's ``decode_seq_seconds``, pooled over its performance class as
    ``pooled_fits`` pools the prefill fit. ``workers``: ``(worker id, perf class or None, decode
    fit moments or None)``. A worker whose class has no separable fit borrows the mean of those
    that have one, else 0 (not known: a router then leaves decode cost out)."""
    workers = list(workers)
    out: dict[Hashable, float] = {}
    for members in _by_class(workers).values():
        moments = [m for _, _, m in members if m is not None and m[0] > 0]
        seq_s = decode_seq_seconds(sum_moments(moments)) if moments else None
        if seq_s is not None:
            out.update((wid, seq_s) for wid, *_ in members)
    prior = sum(out.values()) / len(out) if out else 0.0
    for wid, *_ in workers:
        out.setdefault(wid, prior)
    return out


def _by_class(workers: list[tuple]) -> dict[Hashable, list[tuple]]:
    """Workers (tuples of worker id, perf class or None, ...) grouped by performance class; a
    worker with no class is a class of its own."""
    groups: dict[Hashable, list] = {}
    for w in workers:
        wid, perf_class = w[0], w[1]
        groups.setdefault(("worker", wid) if perf_class is None else perf_class, []).append(w)
    return groups


def sum_moments(many: Iterable[Sequence[float]]) -> list[float]:
    """The moments of several workers' steps taken together (a pooled fit)."""
    total = [0.0] * 5
    for m in many:
        for i in range(5):
            total[i] += m[i]
    return total


def pooled_fits(
    workers: Iterable[
        tuple[Hashable, Hashable | None, Sequence[float] | None, tuple[float, float] | None]
    ],
) -> dict[Hashable, tuple[float, float]]:
    """Each worker's ``(overhead_s, tokens_per_s)``, pooled over its performance class.

    ``workers``: ``(worker id, perf class or None, fit moments or None, own fit or None)``.
    Workers of one class share one fit over all their moments, so a router compares their load
    and cache, not the noise between their separate fits. A worker with no class is a class of
    its own; one with no moments keeps its own fit; one with neither borrows the mean rate of
    those that have one, else ``PRIOR_PREFILL_TPS``, so a new worker is neither shunned nor
    flooded. The live router and the simulator both call this.
    """
    workers = list(workers)
    fits: dict[Hashable, tuple[float, float]] = {}
    for members in _by_class(workers).values():
        moments = [m for _, _, m, _ in members if m is not None and m[0] > 0]
        pooled = fit_moments(sum_moments(moments)) if moments else None
        for wid, _, _, own in members:
            fit = pooled or own
            if fit is not None:
                fits[wid] = fit
    prior = sum(rate for _, rate in fits.values()) / len(fits) if fits else PRIOR_PREFILL_TPS
    for wid, *_ in workers:
        fits.setdefault(wid, (0.0, prior))
    return fits


class StepCostModel:
    """Fits ``step_seconds ~ overhead + tokens / rate`` over recent prefill steps (exponentially
    weighted least squares).

    A plain tokens/seconds ratio is biased by the fixed cost of a step: a worker that happened
    to prefill long prompts looks faster than one that prefilled short ones, a router then
    favours it, and it keeps looking fast. Separating the per-step overhead from the marginal
    per-token cost makes identical workers report identical rates whatever their mix.
    """

    def __init__(self, decay: float = 0.95):
        if not 0 < decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        self.decay = decay
        self._s = [0.0] * 5  # weights, sum x, sum y, sum x^2, sum x*y

    def update(self, tokens: int, seconds: float) -> None:
        d = self.decay
        s0, sx, sy, sxx, sxy = self._s
        x, y = float(tokens), float(seconds)
        self._s = [d * s0 + 1, d * sx + x, d * sy + y, d * sxx + x * x, d * sxy + x * y]

    @property
    def moments(self) -> list[float]:
        return list(self._s)

    def fit(self) -> tuple[float, float] | None:
        """(overhead seconds, tokens per second), or None before any prefill step."""
        return fit_moments(self._s)


def step_fixed_s(overhead_s: float, running: int, decode_step_s: float) -> float:
    """What one engine step costs besides its prefill tokens: the prefill fit's intercept (the
    fixed cost, with the decodes that rode along with the chunks it was fitted on, on average)
    or, while ``running`` requests decode, a decode step as the worker measures it now, whichever
    is more. Not their sum: both hold the step's fixed cost."""
    return max(overhead_s, decode_step_s) if running else overhead_s


def _per_step(budget: int, running: int) -> float:
    """Prefill tokens a step holds: the budget less one token per running decode (at least one);
    a budget of 0 (not reported) holds whatever is queued."""
    return max(1, budget - running) if budget > 0 else math.inf


def queue_wait_seconds(
    queued: float,
    running: int,
    budget: int,
    overhead_s: float,
    tokens_per_s: float,
    decode_step_s: float = 0.0,
) -> float:
    """Seconds before a new request's first step starts behind ``queued`` prefill tokens: the
    ``floor(queued / (budget - running))`` steps that run before it (its first chunk rides in
    the step that computes the queue's last tokens, on the budget they leave), each at
    ``step_fixed_s``, and the queued tokens at ``tokens_per_s``. Nothing queued: 0."""
    if queued <= 0:
        return 0.0
    steps = queued // _per_step(budget, running)
    return steps * step_fixed_s(overhead_s, running, decode_step_s) + queued / tokens_per_s
