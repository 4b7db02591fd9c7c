"""``Headroom``: how close the fleet is to saturation, from what the router already measures.

Each routed request brings the fleet prefill work, in worker-seconds (its uncached tokens at its
worker's fitted rate plus a step's fixed cost). Work arriving per second over the worker-seconds
the fleet has per second is its utilisation, ``rho``; ``headroom = 1 - rho`` (<= 0: work arrives
faster than the fleet does it). Both means are moving averages over ``memory`` arrivals.
``reuse_weight`` is the M/M/1 mean number in system, ``rho / (1 - rho)``: how many requests a
second of extra work delays (docs/ttft_policy.md, "recompute"). Per worker (``waiting_all``),
the requests waiting on it averaged over about ``memory`` arrivals per worker: while the fleet is
saturated, ttft lets a worker whose mean queue is under the fleet's count a shared prefix as held.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable

from radixray.numbers import Ewma

__all__ = ["Headroom"]


class Headroom:
    """The fleet's measured utilisation. ``observe`` once per routed request; read ``rho``,
    ``headroom`` and ``reuse_weight``. Not thread-safe (one router's event loop calls it)."""

    def __init__(self, memory: int = 64):
        if memory < 2:
            raise ValueError(f"memory must be >= 2 arrivals, got {memory}")
        self.memory = memory
        # both from 0, sampled together: their ratio weighs every arrival alike
        self._work = Ewma(1.0 / memory, initial=0.0)  # worker-seconds per request
        self._gap = Ewma(1.0 / memory, initial=0.0)  # seconds between arrivals, x workers
        self._last: float | None = None
        self.seen = 0  # arrivals that gave a sample (all but the first)
        # worker -> moving sums of the requests waiting on it at arrivals, and of the arrivals
        self._waiting: dict[Hashable, tuple[float, float]] = {}

    def observe(self, now: float, work_s: float, workers: int) -> None:
        """A request arrived at ``now`` (seconds, any monotonic clock) bringing ``work_s``
        worker-seconds of prefill to a fleet of ``workers`` routable workers."""
        if self._last is not None:
            self._gap.update(max(0.0, now - self._last) * workers)
            self._work.update(max(0.0, work_s))
            self.seen += 1
        self._last = now if self._last is None else max(self._last, now)

    def waiting_all(
        self, waiting: Iterable[tuple[Hashable, int]], workers: int
    ) -> dict[Hashable, float]:
        """Take the requests waiting on each worker at an arrival to a fleet of ``workers``
        (``(worker, requests waiting on it)`` pairs); return each one's moving average over
        about ``memory`` arrivals per worker: worker -> its mean queue."""
        keep = 1.0 - 1.0 / (self.memory * max(1, workers))
        sums, means = self._waiting, {}
        for worker, now in waiting:
            total, count = sums.get(worker, (0.0, 0.0))
            total, count = keep * total + now, keep * count + 1.0
            sums[worker] = (total, count)
            means[worker] = total / count
        return means

    def forget(self, live: Collection[Hashable]) -> None:
        """Drop the per-worker averages of workers gone from the fleet (not in ``live``), once
        they outnumber the live ones."""
        if len(self._waiting) > 2 * len(live):
            self._waiting = {w: v for w, v in self._waiting.items() if w in live}

    @property
    def rho(self) -> float:
        """Offered work over capacity (0 until two arrivals were seen; may exceed 1)."""
        work, gap = self._work.value, self._gap.value
        if gap <= 0.0:
            return float("inf") if work > 0 else 0.0
        return work / gap

    @property
    def headroom(self) -> float:
        """``1 - rho``: the share of the fleet's prefill capacity left; <= 0 when saturated."""
        return 1.0 - self.rho

    @property
    def saturated(self) -> bool:
        """Work arrives at least as fast as the fleet does it, by an estimate over ``memory``
        arrivals (False before it has them)."""
        return self.seen >= self.memory and self.rho >= 1.0

    @property
    def reuse_weight(self) -> float:
        """``rho / (1 - rho)``, ``rho`` clipped below ``1 - 1 / memory``; 0 until ``memory``
        arrivals were seen (a cold start's misses, arriving together, would read as saturation)."""
        if self.seen < self.memory:
            return 0.0
        rho = min(self.rho, 1.0 - 1.0 / self.memory)
        return rho / (1.0 - rho)
