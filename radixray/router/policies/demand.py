"""``PrefixDemand``: how often recent arrivals asked for a prefix, for ttft's margin.

The margin keeps a request on its prefix's holder unless a move saves more than a share of the
holder's cost; but a copy of a prefix asked for more often than its holders serve pays for
itself, so the margin holds only where no copy is wanted. Each arrival is keyed by the deepest
block any worker holds of its prompt (what a move would recompute); a prefix is
under-replicated when its share of the last ``window`` arrivals times the workers exceeds its
holders (docs/ttft_policy.md, "The margin"). Not thread-safe (one router's event loop calls it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

__all__ = ["PrefixDemand"]


class PrefixDemand:
    """The share of the last ``window`` arrivals that asked for each deepest held prefix."""

    def __init__(self, window: int = 1024):
        if window < 1:
            raise ValueError(f"window must be >= 1 arrival, got {window}")
        self.window = window
        self._order: deque[Hashable | None] = deque()
        self._counts: dict[Hashable, int] = {}

    def observe(self, key: Hashable | None) -> None:
        """One arrival, keyed by the deepest block any worker holds of its prompt (None: no
        worker holds any of it; it counts in the window, under no prefix)."""
        order, counts = self._order, self._counts
        if len(order) == self.window and (old := order.popleft()) is not None:
            counts[old] -= 1
            if not counts[old]:
                del counts[old]
        order.append(key)
        if key is not None:
            counts[key] = counts.get(key, 0) + 1

    def share(self, key: Hashable | None) -> float:
        """The share of the window's arrivals keyed ``key`` (0.0 for None or an empty window)."""
        if key is None or not self._order:
            return 0.0
        return self._counts.get(key, 0) / len(self._order)

    def under_replicated(self, key: Hashable | None, holders: int, workers: int) -> bool:
        """Whether the prefix ``key`` is asked for more often than its ``holders`` of ``workers``
        serve: its share of the arrivals over their share of the workers."""
        return self.share(key) * workers > holders

    def __len__(self) -> int:
        return len(self._order)
