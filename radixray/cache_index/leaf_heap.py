"""``LeafHeap``: a set of evictable tree nodes and a lazily refreshed heap in eviction order.

Priorities only grow (a later access time, a larger hit count), so the heap is refreshed lazily:
a popped entry whose priority is stale is pushed back with the current one. The popped entry is
the true minimum once its stored priority is current, because every other entry's stored
priority is a lower bound of its node's current one. Entries of nodes that left the set are
skipped when popped and dropped when the heap is rebuilt.

The radix tree keeps one per tier: device leaves (device pages, unlocked, no child with device
pages) and host leaves (host pages only, unlocked, no children).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

__all__ = ["LeafHeap"]


class LeafHeap:
    def __init__(self, priority: Callable[[object], object]):
        self._priority = priority
        self.members: set = set()
        self._heap: list[tuple[object, int, object]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self.members)

    def __contains__(self, node) -> bool:
        return node in self.members

    def _push(self, node) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (self._priority(node), self._seq, node))

    def add(self, node) -> None:
        if node not in self.members:
            self.members.add(node)
            self._push(node)

    def lowered(self, node) -> None:
        """``node``'s priority fell (the one exception to "only grow"): an entry at the new
        priority; the old one is refreshed or skipped when popped."""
        if node in self.members:
            self._push(node)

    def discard(self, node) -> None:
        self.members.discard(node)

    def set_member(self, node, member: bool) -> None:
        if member:
            self.add(node)
        else:
            self.members.discard(node)

    def pop(self):
        """Remove and return the member with the smallest current priority (None if empty)."""
        heap, members, prio = self._heap, self.members, self._priority
        while members:
            p, _, node = heapq.heappop(heap)
            if node not in members:
                continue  # stale: the node was locked, got a child or was evicted
            if prio(node) != p:
                self._push(node)
                continue
            members.discard(node)
            if len(heap) > 2 * len(members) + 64:
                self._rebuild()
            return node
        return None

    def _rebuild(self) -> None:
        self._heap = []
        for node in self.members:
            self._seq += 1
            self._heap.append((self._priority(node), self._seq, node))
        heapq.heapify(self._heap)

    def clear(self) -> None:
        self.members.clear()
        self._heap.clear()
