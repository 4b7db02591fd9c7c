"""Admission: whether the router accepts a request now, or answers 429 with a Retry-After.

Two limits, checked in this order before a request is routed (``request_path.py``):

* **count** (``max_inflight``, ``max_inflight_per_worker``): requests accepted and not ended,
  across the fleet and on every routable worker. A hard cap on what the router holds.
* **queueing delay** (``max_queue_s``): the time a new request would wait before its prefill
  starts on the least-queued routable worker, from the same numbers the routing policies price
  time with: the worker's queued prefill tokens (this router's tally plus the others' from its
  report; what the queue will compute, net of the worker's cache, ``QueuedPrefill``) by the
  engine steps that run before the request's first (``step_cost.queue_wait_seconds``: each
  step's budget less the decodes it carries, each step's fixed cost, the tokens at the pooled
  prefill fit). Measured against the simulator deep in a queue, where this limit acts, that is
  0.99x the wait (benchmarks/HISTORY.md, "Queued work net of the cache"). When even that
  worker would make it wait longer than ``max_queue_s``, every placement would, so the request
  is refused and told to come back when that worker's backlog beyond the limit has drained at
  its rate (``retry_after``), instead of joining a queue that only grows: past saturation (the
  policy's ``headroom`` <= 0, shown on ``/metrics``) work arrives faster than the fleet computes
  it, and a request admitted into that queue waits longer than its client does.

The delay limit needs measured rates: before any worker has reported a prefill step the router
knows only a nominal prior (``PRIOR_PREFILL_TPS``), which says nothing about seconds, so only
the count applies. The simulator calls ``queue_wait_s`` too, so that its admission is the live
router's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from radixray.protocol import Overloaded

from .policies import WorkerState

__all__ = ["Admission", "queue_wait_s", "retry_after"]


def queue_wait_s(states: Iterable[WorkerState]) -> float | None:
    """The shortest queueing delay any of ``states`` offers a new request, by the engine steps
    that run before its first (``WorkerState.queue_wait_s``); None: no worker."""
    return min((w.queue_wait_s() for w in states), default=None)


def retry_after(wait_s: float, max_queue_s: float, floor_s: int = 1) -> int:
    """Whole seconds until a backlog of ``wait_s`` has drained to ``max_queue_s`` at the rate it
    is computed, ignoring new arrivals (the earliest the request could be admitted); at least
    ``floor_s``."""
    return max(floor_s, math.ceil(wait_s - max_queue_s))


class Admission:
    """Requests accepted and not yet ended, across all workers, up to ``limit``; room on some
    worker: fewer than ``per_worker`` requests on it, and a queue under ``max_queue_s`` (each
    None: no such limit). The live router and the simulator both admit through it."""

    def __init__(
        self,
        limit: int | None = None,
        max_queue_s: float | None = None,
        per_worker: int | None = None,
    ):
        if max_queue_s is not None and not max_queue_s > 0:
            raise ValueError(f"max_queue_s must be > 0 seconds or None, got {max_queue_s}")
        self.limit = limit
        self.max_queue_s = max_queue_s
        self.per_worker = per_worker
        self.inflight = 0
        self.refused = {"inflight": 0, "per_worker": 0, "queue": 0}  # refusals by limit

    def admit(self) -> None:
        """Take a slot or raise ``Overloaded``."""
        limit = self.limit
        if limit is not None and self.inflight >= limit:
            self.refused["inflight"] += 1
            raise Overloaded(
                f"The server is overloaded: {self.inflight} requests in flight (limit "
                f"{limit}); retry later"
            )
        self.inflight += 1

    def check_room(
        self, states: Sequence[WorkerState], wait_s: float | None, floor_s: int = 1
    ) -> None:
        """Raise ``Overloaded`` when no routable worker (``states``) has room for a new
        request: every one at ``per_worker`` requests, or (``check_queue``) the shortest queue,
        ``wait_s`` seconds, over ``max_queue_s``."""
        limit = self.per_worker
        if limit and states and all(s.load >= limit for s in states):
            self.refused["per_worker"] += 1
            raise Overloaded(
                f"The server is overloaded: every worker has {limit} requests in flight; "
                "retry later"
            )
        self.check_queue(wait_s, floor_s)

    def check_queue(self, wait_s: float | None, floor_s: int = 1) -> None:
        """Raise ``Overloaded`` (with its ``retry_after_s``) when the shortest queue a new
        request could join, ``wait_s`` seconds (None: not known), is over ``max_queue_s``."""
        limit = self.max_queue_s
        if limit is None or wait_s is None or wait_s <= limit:
            return
        self.refused["queue"] += 1
        raise Overloaded(
            f"The server is overloaded: a new request would wait {wait_s:.1f} s before its "
            f"prefill on the least-queued worker (limit {limit:g} s, max_queue_s); retry later",
            retry_after_s=retry_after(wait_s, limit, floor_s),
        )

    def release(self) -> None:
        self.inflight -= 1
