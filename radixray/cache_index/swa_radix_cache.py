"""SWARadixCache: the radix cache of a model with sliding-window layers (docs/window_cache.md).

Each tree page is a full-attention page (``RadixCache``'s page ids) and, while it has one, a
window page (``WindowedAllocator``): the window layers' KV of the same positions. A page whose
window page was dropped is a *tombstone*: its full page stays, so a longer match can still use
it where a whole window follows, but a query just after it cannot. So a match is cut back to
the last page boundary ``e`` where every page holding positions ``e*P - W + 1 .. e*P - 1`` has
its window page (``reusable_pages``, right to left as vLLM's hybrid manager checks).

Window pages go before full pages: ``evict_window`` drops them from unlocked nodes, first those
more than a window before every leaf's end (the ends stay reusable), then the rest in eviction
order. A running request drops the window pages of cached pages out of its window where no
other request holds them (``drop_window_held``), and a request that recomputed a tombstoned page
gives the cached page its window page back (``revive_window``).

KV events carry the group (``events``): every stored block is stored in the full-attention
group (0) and, while its window page is there, in the sliding-window group (1, with the window);
a dropped window page is a ``BlockRemoved`` of group 1. A block removed from group 0 is gone
from both.

With a host tier (``host_allocator``: a ``WindowedAllocator`` of host pages) demotions and
load-backs move window pages too (``swa_host``); a match counts a host-only page's host window
page as its window page, so the reusable prefix is cut over both tiers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .cache_contract import MatchResult
from .events import BlockRemoved, BlockStored, KVEvent
from .host_tier import HOST
from .radix_cache import RadixCache
from .radix_tree import EVICTION_POLICIES, TreeNode
from .swa_host import WINDOW_GROUP, SWAHostTier, in_window_group, window_runs
from .window_pages import WindowedAllocator, reusable_pages

__all__ = ["SWARadixCache", "reusable_pages", "WINDOW_GROUP"]


class SWARadixCache(RadixCache):
    def __init__(
        self,
        page_size: int,
        allocator: WindowedAllocator,
        eviction: str = "lru",
        enable_events: bool = False,
        ghost_capacity: int | None = None,
        medium: str | None = "GPU",
        host_allocator=None,
    ):
        if not isinstance(allocator, WindowedAllocator):
            raise TypeError("SWARadixCache needs a WindowedAllocator (a window pool)")
        kw = {} if ghost_capacity is None else {"ghost_capacity": ghost_capacity}
        super().__init__(
            page_size, allocator, eviction, enable_events, medium=medium,
            host_allocator=host_allocator, **kw,
        )  # fmt: skip
        self.window = allocator.window
        self.num_window_evicted = 0  # window pages dropped by evict_window
        self._announced = False

    # -------------------------------------------------------------- match / insert

    def _host_tier(self, host_allocator, emit) -> SWAHostTier:
        return SWAHostTier(host_allocator, self._tree, self._ghost, emit, self.allocator)

    def _flags(self, pages: Sequence[int], host: Sequence[int] = ()) -> list[bool]:
        """Whether each page of a path (device pages, then host-only pages) has its window
        page: a device page's in the device window pool, a host-only page's on the host."""
        flags = list(map(self.allocator.has_window, pages))
        if host:
            flags += map(self.host_allocator.has_window, host)
        return flags

    def match_prefix(self, token_ids: Sequence[int], extra_key: str | None = None) -> MatchResult:
        m = super().match_prefix(token_ids, extra_key)
        flags = self._flags(m.pages, m.host_pages)
        k = reusable_pages(flags, bool, self.page_size, self.window)
        if k == len(flags):
            return m
        tokens = list(token_ids[: k * self.page_size])
        return (
            super()
            .match_prefix(tokens, extra_key)
            ._replace(window_tokens=m.num_tokens + m.host_tokens - len(tokens))
        )

    def load_back(self, m: MatchResult, pages: Sequence[int]) -> MatchResult:
        """``RadixCache.load_back``, with the window pages of the last window before the match
        end (``SWAHostTier.load_back``), announced in the window group."""
        before = len(self._events)
        full = super().load_back(m, pages)
        if len(self._events) > before:
            ev = self._events[-1]
            present = map(self.allocator.has_window, pages)
            self._stored_runs(ev.block_hashes, ev.parent_block_hash, ev.token_ids, present)
        return full

    def peek_prefix(
        self, token_ids: list[int], block_hashes: Sequence[int], extra_key: str | None = None
    ) -> int:
        """``RadixCache.peek_prefix`` cut to the reusable prefix, read-only: the pages along
        the peeked path, found by their first-page keys."""
        P = self.page_size
        n = super().peek_prefix(token_ids, block_hashes, extra_key) // P
        flags: list[bool] = []
        node = self._tree.roots().get(extra_key)
        while node is not None and len(flags) < n:
            node = node.children.get(tuple(token_ids[len(flags) * P : (len(flags) + 1) * P]))
            if node is not None:
                k = len(node.hashes)
                flags += (self._flags(node.pages) if node.pages else self._flags([], node.host))[
                    : n - len(flags)
                ]
                if k == 0:
                    break
        return reusable_pages(flags, bool, P, self.window) * P

    def match_cached(self, token_ids: Sequence[int], extra_key: str | None = None) -> MatchResult:
        """The longest cached prefix, whether or not its window pages are there (a request that
        just inserted its pages locks them all: it computed its own window)."""
        return super().match_prefix(token_ids, extra_key)

    def insert(
        self,
        token_ids: Sequence[int],
        pages: Sequence[int],
        extra_key: str | None = None,
        block_hashes: Sequence[int] | None = None,
    ) -> int:
        before = len(self._events)
        cached = super().insert(token_ids, pages, extra_key, block_hashes)
        if len(self._events) > before:  # the full group's BlockStored of the new pages
            ev = self._events[-1]
            if not self._announced:  # a router learns the window before any window block
                self._events.append(self._marker())
                self._announced = True
            first = cached // self.page_size
            new = pages[first : first + len(ev.block_hashes)]
            has = self.allocator.has_window
            self._stored_runs(ev.block_hashes, ev.parent_block_hash, ev.token_ids, map(has, new))
        return cached

    # -------------------------------------------------------------- window pages

    def _stored_runs(
        self, hashes, parent, tokens, present: Iterable[bool], medium: str | None = None
    ) -> None:
        """Window-group BlockStored events for the runs of pages that have window pages (on the
        device, or on ``medium``'s tier)."""
        medium = medium or self.medium
        P, W = self.page_size, self.window
        self._events += window_runs(hashes, parent, tokens, present, P, medium, W)

    def _marker(self) -> BlockStored:
        """An empty window-group BlockStored: says that this worker has a window group, and
        its window, before (or without) any block of it."""
        return in_window_group(BlockStored([], None, [], self.page_size, self.medium), self.window)

    def _drop(self, node: TreeNode, idx: Iterable[int]) -> int:
        """Drop the window pages of ``node``'s pages at ``idx`` (those that have one)."""
        alloc = self.allocator
        idx = [j for j in idx if alloc.has_window(node.pages[j])]
        if not idx:
            return 0
        alloc.drop_window([node.pages[j] for j in idx])
        if self.enable_events:
            ev = BlockRemoved([node.hashes[j] for j in idx], self.medium)
            self._events.append(in_window_group(ev, self.window))
        return len(idx)

    def window_evictable(self) -> int:
        """Window pages of cached pages nobody holds (what ``evict_window`` could drop)."""
        has = self.allocator.has_window
        return sum(
            sum(map(has, n.pages)) for n in self._tree.iter_nodes() if not n.lock_ref and n.pages
        )

    def evict_window(self, num_pages: int) -> int:
        """Drop at least ``min(num_pages, window_evictable())`` window pages of unlocked nodes:
        first those more than a window before the nearest leaf end below them (every cached
        prefix's end stays reusable), then the rest, in eviction order. Returns the count."""
        if num_pages <= 0:
            return 0
        P, W = self.page_size, self.window
        nodes = list(self._tree.iter_nodes())
        below: dict[TreeNode, int] = {}  # tokens from a node's end to its nearest leaf end
        for node in reversed(nodes):  # children before parents
            below[node] = min((len(c.key) + below[c] for c in node.children.values()), default=0)
        free = sorted((n for n in nodes if not n.lock_ref and n.pages), key=self._priority)
        freed = 0
        for keep_ends in (True, False):
            for node in free:
                if freed >= num_pages:
                    break
                k = len(node.pages)
                idx = [j for j in range(k) if not (keep_ends and (k - 1 - j) * P + below[node] < W)]
                freed += self._drop(node, idx)
        self.num_window_evicted += freed
        return freed

    def drop_window_held(self, node: TreeNode, lo: int, hi: int) -> int:
        """Drop the window pages of the path's pages ``lo .. hi - 1`` (root = page 0; ``node``
        is the end of a request's locked path) where only that request holds them (lock_ref 1:
        no other lock passes through the node). Returns the count."""
        dropped = 0
        for n, start in self._path(node):
            if n.lock_ref == 1 and start < hi and start + len(n.pages) > lo:
                dropped += self._drop(
                    n, range(max(lo, start) - start, min(hi - start, len(n.pages)))
                )
        return dropped

    def revive_window(self, node: TreeNode, first: int, dups: Sequence[int]) -> None:
        """Cached pages ``first ..`` of the path to ``node`` whose window pages were dropped take
        the window pages of ``dups`` (a request's copies of the same positions, about to be
        freed), and are announced in the window group again."""
        alloc, hi = self.allocator, first + len(dups)
        for n, start in self._path(node):
            lo_j, hi_j = max(first, start) - start, min(hi, start + len(n.pages)) - start
            moved = [
                alloc.move_window(dups[start + j - first], n.pages[j]) for j in range(lo_j, hi_j)
            ]
            if self.enable_events and any(moved):
                parent = n.hashes[lo_j - 1] if lo_j else n.parent.last_hash
                P = self.page_size
                tokens = n.key[lo_j * P : hi_j * P]
                self._stored_runs(n.hashes[lo_j:hi_j], parent, tokens, moved)

    def _path(self, node: TreeNode) -> list[tuple[TreeNode, int]]:
        """The nodes from the root to ``node`` with the page index each starts at."""
        path = []
        while node.parent is not None:
            path.append(node)
            node = node.parent
        out, start = [], 0
        for n in reversed(path):
            out.append((n, start))
            start += len(n.pages)
        return out

    @property
    def _priority(self):
        return EVICTION_POLICIES[self.eviction]

    # -------------------------------------------------------------- snapshot / invariants

    def snapshot_events(self) -> list[KVEvent]:
        events = super().snapshot_events()
        events.append(self._marker())
        self._events, saved = events, self._events
        try:
            has = self.allocator.has_window
            for node in self._tree.iter_nodes():
                parent = node.parent.last_hash
                self._stored_runs(node.hashes, parent, node.key, map(has, node.pages))
                if node.host:
                    on_host = map(self.host_allocator.has_window, node.host)
                    self._stored_runs(node.hashes, parent, node.key, on_host, HOST)
        finally:
            self._events = saved
        return events

    def check_integrity(self, held_pages: Iterable[int] | None = None) -> None:
        super().check_integrity(held_pages)
        self.allocator.check_window()
        if self.host is not None:
            self.host_allocator.check_window()

    def __repr__(self) -> str:
        return f"SWA{super().__repr__()[:-1]}, window={self.window})"
