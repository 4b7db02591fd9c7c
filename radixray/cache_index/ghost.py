"""A bounded memory of block hashes that were cached and then evicted.

It answers one question for miss attribution: of the blocks a new request is missing, how many
did this cache hold once? Those are "evicted" misses (the cache is too small or the policy chose
badly), the rest are "cold" (never seen). Oldest entries are dropped first; a block that is
cached again leaves the list.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Iterable, Sequence

__all__ = ["GhostList"]


class GhostList:
    def __init__(self, capacity: int):
        if capacity < 0:
            raise ValueError(f"ghost capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self._hashes: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._hashes)

    def __contains__(self, h: int) -> bool:
        return h in self._hashes

    def add(self, hashes: Iterable[int]) -> None:
        if self.capacity == 0:
            return
        d = self._hashes
        for h in hashes:
            if h in d:
                d.move_to_end(h)
            else:
                d[h] = None
        while len(d) > self.capacity:
            d.popitem(last=False)

    def discard(self, hashes: Iterable[int]) -> None:
        d = self._hashes
        if d:
            for h in hashes:
                d.pop(h, None)

    def leading_hits(self, hashes: Sequence[int]) -> int:
        """How many leading ``hashes`` are in the list."""
        d = self._hashes
        n = 0
        for h in hashes:
            if h not in d:
                break
            n += 1
        return n

    def memory_bytes(self) -> int:
        """Estimated bytes held: the ordered dict (its table and links) and a 64-bit int per
        entry (~140 bytes an entry, tracemalloc's count within 3%)."""
        return sys.getsizeof(self._hashes) + len(self._hashes) * sys.getsizeof(1 << 63)

    def clear(self) -> None:
        self._hashes.clear()
