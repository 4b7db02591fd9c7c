"""``Waiting``: which of a worker's queued prefill work a new request would wait behind.

A worker reports its queue as one number, the tokens its waiting requests will compute (net of
what its cache holds) plus what its running prefills have left. A new request does not wait
behind all of it: the engine's scheduler admits waiting requests by longest cached prefix
(``Scheduler``: LPM order, FCFS among equals), so a request that finds much of its prompt cached
on a worker goes ahead of the waiting ones that find less, and the cached part of a waiting
prompt is never computed. Charged the whole queue, ttft's predicted wait behind a queue was
about twice the wait measured on Mooncake. ``ttft:lpm=true`` uses this estimate instead; it is
off by default: on the hot-prefix workload it kept the hot prompt on 4 workers of 8 (TTFT p50
0.32 s against 0.22; docs/ttft_policy.md, "Copies of a prefix"), and on Mooncake it takes a
request just placed and already running for a waiting one, so short cached requests are sent
behind a long prefill they cannot pass (p99 4.93 s against 4.47 at 1.5x). With the queue ahead
taken exactly from the simulated scheduler, ttft places as it does with the whole queue
(docs/ttft_policy.md, "Where the hit rate below the line goes").

This router knows what it placed on each worker (tokens, predicted cached) and which of those
finished. A worker reporting ``waiting`` requests is waiting on the last ``waiting`` that this
router placed there and has not seen finish (an approximation: admission is by prefix length,
not arrival). Ahead of a request with ``c`` tokens cached on the worker: what the running
prefills have left (the queue less the waiting prompts' uncached work), and the uncached work of
the waiting requests whose cached prefix is at least ``c``. Where this router did not place
every waiting request (another router's, or records lost) it falls back to the whole queue.
"""

from __future__ import annotations

from collections.abc import Hashable
from itertools import islice

from .base import WorkerState

__all__ = ["Waiting"]


class Waiting:
    """Requests this router placed and has not seen finish, per worker, in placement order.
    ``cap`` bounds each worker's record (a request whose completion never comes, e.g. one
    retried elsewhere after a failure, is dropped with the oldest)."""

    def __init__(self, cap: int = 4096):
        if cap < 1:
            raise ValueError(f"cap must be >= 1, got {cap}")
        self.cap = cap
        self._placed: dict[Hashable, dict[Hashable, tuple[int, int]]] = {}

    def placed(self, worker_id: Hashable, request_id: Hashable, tokens: int, cached: int) -> None:
        mine = self._placed.setdefault(worker_id, {})
        mine.pop(request_id, None)
        mine[request_id] = (tokens, cached)
        if len(mine) > self.cap:
            del mine[next(iter(mine))]

    def finished(self, worker_id: Hashable, request_id: Hashable) -> None:
        mine = self._placed.get(worker_id)
        if mine is not None:
            mine.pop(request_id, None)

    def in_flight(self, worker_id: Hashable) -> int:
        return len(self._placed.get(worker_id, ()))

    def ahead(self, w: WorkerState, cached: int) -> int:
        """Prefill tokens queued on ``w`` ahead of a request that finds ``cached`` tokens
        there (the whole queue when this router cannot tell which requests are waiting)."""
        queued, n = w.queued_prefill_tokens, w.waiting
        mine = self._placed.get(w.worker_id)
        if n <= 0 or not mine or len(mine) < n:
            return queued
        last = list(islice(reversed(mine.values()), n))
        running_left = max(0, queued - sum(t - c for t, c in last))
        return running_left + sum(t - c for t, c in last if c >= cached)

    def __repr__(self) -> str:
        return f"Waiting({sum(map(len, self._placed.values()))} in flight)"
