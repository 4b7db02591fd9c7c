"""``HerdAlarm``: notices the router's decisions piling onto one worker while others sit idle.

Routers that each see a stale or partial picture (several replicas, a burst between two load
reports, a cache-affinity rule followed past its worth) can all send their traffic to the same
"best" worker. Over the last ``window`` decisions, a worker is herded when its share of them is
well above its share of the fleet's capacity (KV pages)::

    share_w > max(factor * capacity_w, capacity_w + margin)

while at least one other routable worker is idle (nothing running or waiting). A herd raises a
log line, once per episode, with the decision records that show it (the policy's reasons and
scores), a gauge per worker and a counter of episodes (``/metrics``), and the episode itself in
``/debug/decisions``. Concentration on a worker while the others are busy too is not a herd:
it is load following the cache.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Sequence

from .policies import WorkerState

__all__ = ["HerdAlarm"]

log = logging.getLogger(__name__)


class HerdAlarm:
    def __init__(self, window: int = 64, factor: float = 2.0, margin: float = 0.25, keep: int = 8):
        if window < 2:
            raise ValueError(f"window must be >= 2, got {window}")
        self.window = window
        self.factor = factor
        self.margin = margin
        self._recent: deque[str] = deque(maxlen=window)
        self._counts: Counter[str] = Counter()
        self._records: dict[str, deque] = {}  # worker -> its last ``keep`` decision records
        self._keep = keep
        self.active: dict[str, dict] = {}  # worker -> the episode in progress
        self.episodes = 0

    def observe(self, worker_id: str, states: Sequence[WorkerState], record) -> None:
        """One decision: ``record`` (a DecisionRecord) sent a request to ``worker_id``;
        ``states`` is what the policy saw."""
        if len(self._recent) == self.window:
            self._counts[self._recent[0]] -= 1
        self._recent.append(worker_id)
        self._counts[worker_id] += 1
        self._records.setdefault(worker_id, deque(maxlen=self._keep)).append(record)
        if len(self._recent) < self.window or not states:
            return
        # Episodes end when the concentration is gone (not when the idle workers get busy: that
        # would flap with every request).
        for w, ep in list(self.active.items()):
            if self._counts[w] / self.window <= ep["threshold"]:
                del self.active[w]
        if worker_id in self.active:
            return
        share = self._counts[worker_id] / self.window
        pages = sum(s.total_pages for s in states)
        own = next((s for s in states if s.worker_id == worker_id), None)
        capacity = (own.total_pages / pages) if pages and own else 1 / len(states)
        threshold = max(self.factor * capacity, capacity + self.margin)
        idle = [s.worker_id for s in states if s.worker_id != worker_id and not s.load]
        if share > threshold and idle:
            self._start(worker_id, share, capacity, threshold, idle)

    def _start(
        self, worker_id: str, share: float, capacity: float, threshold: float, idle: list[str]
    ) -> None:
        self.episodes += 1
        records = [r.as_dict() for r in self._records.get(worker_id, ())]
        episode = {
            "worker_id": worker_id,
            "share": round(share, 3),
            "capacity_share": round(capacity, 3),
            "threshold": threshold,
            "idle_workers": sorted(idle),
            "window": self.window,
            "since": time.time(),
            "decisions": records,
        }
        self.active[worker_id] = episode
        log.warning(
            "herding: %.0f%% of the last %d decisions went to worker %s (its share of capacity "
            "%.0f%%) while %s sat idle; recent decisions: %s",
            100 * share,
            self.window,
            worker_id,
            100 * capacity,
            ", ".join(sorted(idle)),
            "; ".join(f"{r['request_id']}: {r['reason']}" for r in records),
        )

    def herded(self, worker_id: str) -> bool:
        return worker_id in self.active
