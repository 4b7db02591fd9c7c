"""``IdealTail``: the TTFT tail a workload sets by itself, for ttft's tail guard.

Every request has an ideal time to first token: its prompt less the longest prefix any worker
holds, prefilled on the worker that would compute it soonest if nothing were queued (an idle
one when there is one; a decoding worker's one-step rule adds its decode step: the workers'
``prefill_s``), what the router's index and the workers' fits already give it before choosing.
The tail of that time over recent arrivals, ``quantile`` of the last ``window`` of them, is the
tail no placement can beat: it is the long prompts with nothing cached, which take that long
wherever they go. A placement that leaves a short request waiting on a
busy holder until its TTFT passes that tail adds a request to the tail that need not be there.

With ``ttft:tail`` (docs/ttft_policy.md, "The tail guard, and a margin for moves"; off by
default, measured) a worker's predicted TTFT for the request (its queue and the request's own
prefill) counts the seconds past this tail ``1 + tail`` times: the cost model weighs a second
alike whoever waits it, which is right for the mean and lets the trade build the tail out of
requests that could have been fast.

Exact over a window: a sorted list beside the arrival order (``bisect``: a few microseconds a
request at the default 1,024). ``value`` is None until ``min_samples`` arrivals: with fewer the
quantile is the largest sample, not a tail.
"""

from __future__ import annotations

import bisect
from collections import deque

__all__ = ["IdealTail"]


class IdealTail:
    """The ``quantile`` of the last ``window`` samples. Not thread-safe (one router's event loop
    calls it)."""

    def __init__(self, quantile: float = 0.99, window: int = 1024, min_samples: int = 200):
        if not 0 < quantile < 1:
            raise ValueError(f"quantile must be in (0, 1), got {quantile}")
        if window < 2:
            raise ValueError(f"window must be >= 2 samples, got {window}")
        if not 1 <= min_samples <= window:
            raise ValueError(f"min_samples must be in [1, window={window}], got {min_samples}")
        self.quantile = quantile
        self.window = window
        self.min_samples = min_samples
        self._order: deque[float] = deque()
        self._sorted: list[float] = []

    def observe(self, seconds: float) -> None:
        """One arrival's ideal TTFT, in seconds."""
        if len(self._order) == self.window:
            old = self._order.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        self._order.append(seconds)
        bisect.insort(self._sorted, seconds)

    @property
    def value(self) -> float | None:
        """The tail, in seconds (None before ``min_samples`` arrivals)."""
        n = len(self._sorted)
        if n < self.min_samples:
            return None
        return self._sorted[min(n - 1, int(self.quantile * n))]

    def __len__(self) -> int:
        return len(self._sorted)
