"""Property tests: random request traffic against one RadixCache, checked after every step.

The machine plays a scheduler. "Running requests" match, lock, allocate private pages, then
either finish (insert, free duplicates and the partial tail, unlock) or abort (unlock, free).
Plain inserts, matches, evictions, raw allocator use, double frees and resets are mixed in.

A reference model predicts everything exactly, independently of the tree's shape:

- ``model``: every cached page-aligned prefix (namespace, tokens) -> its page id. A match must
  return exactly the pages of the longest cached prefix; an insert must report exactly the
  cached length and adopt exactly the caller's pages after it.
- ``touch`` / ``hits``: per cached prefix, the logical time it was last matched or inserted and
  how many matches covered it. All pages of one tree node share these (a node is always touched
  whole, splitting where a match ends), and no two leaves share a time, so removing the
  minimum-priority unlocked leaf *page* one at a time gives the tree's eviction order. The pages
  an ``evict`` frees must be exactly a prefix of that order (whole nodes: the tree may stop at
  any node boundary at or after the shortfall).

Events: every step's events are applied to an ApproxIndex, which must hold exactly
``cache.all_block_hashes()``; each BlockStored must carry ``hash_blocks`` of the full prefix.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixray.cache_index import (
    AllBlocksCleared,
    ApproxIndex,
    BlockRemoved,
    BlockStored,
    PageAllocator,
    RadixCache,
    hash_blocks,
)

from .helpers import CACHE_SETTINGS

NAMESPACES = [None, "lora-a"]


@dataclass
class Request:
    tokens: tuple[int, ...]
    extra_key: str | None
    node: object
    matched: list[int]  # cached pages from match_prefix (the cache's, locked)
    private: list[int]  # pages this request computed (including a partial tail page)
    locks: int


class CacheMachine(RuleBasedStateMachine):
    P = 4
    EVICTION = "lru"
    NUM_PAGES = 20
    MAX_FULL_PAGES = 6

    def __init__(self):
        super().__init__()
        P = self.P
        self.alloc = PageAllocator(self.NUM_PAGES)
        self.cache = RadixCache(P, self.alloc, eviction=self.EVICTION, enable_events=True)
        self.index = ApproxIndex(P, max_blocks_per_worker=1 << 20)
        self.model: dict[tuple, int] = {}  # (ns, prefix) -> page id
        self.hashes: dict[tuple, int] = {}  # (ns, prefix) -> block hash
        self.touch: dict[tuple, int] = {}
        self.hits: dict[tuple, int] = {}
        self.ghost: set[int] = set()
        self.clock = 0
        self.history: list[tuple[int, ...]] = []
        self.running: list[Request] = []
        self.scratch: list[list[int]] = []
        self.pending_events: list = []

    # ------------------------------------------------------------------ drawing

    def draw_tokens(self, data) -> tuple[int, ...]:
        """A prompt that often shares a prefix (cut anywhere, not only at page edges) with an
        earlier one, over a 3-token alphabet so that small pages also collide by chance."""
        P = self.P
        base: tuple[int, ...] = ()
        if self.history:
            i = data.draw(st.integers(0, len(self.history)), label="base")
            if i < len(self.history):
                src = self.history[i]
                base = src[: data.draw(st.integers(0, len(src)), label="cut")]
        max_len = self.MAX_FULL_PAGES * P + P - 1
        extra = data.draw(st.integers(0, max(0, max_len - len(base))), label="extra")
        rng = random.Random(data.draw(st.integers(0, 1 << 16), label="seed"))
        toks = base + tuple(rng.randrange(3) for _ in range(extra))
        self.history = (self.history + [toks])[-8:]
        return toks

    # ------------------------------------------------------------------ model helpers

    def prefixes(self, ns, tokens, n_pages):
        P = self.P
        return [(ns, tuple(tokens[: (k + 1) * P])) for k in range(n_pages)]

    def model_match(self, ns, tokens) -> int:
        """Longest cached prefix of ``tokens`` in pages, per the model."""
        k, P = 0, self.P
        while (k + 1) * P <= len(tokens) and (ns, tuple(tokens[: (k + 1) * P])) in self.model:
            k += 1
        return k

    def locked_entries(self) -> set:
        out = set()
        for r in self.running:
            out.update(self.prefixes(r.extra_key, r.tokens, len(r.matched)))
        return out

    def held_pages(self) -> list[int]:
        return [p for r in self.running for p in r.private] + [p for s in self.scratch for p in s]

    def priority(self, e):
        return self.touch[e] if self.EVICTION == "lru" else (self.hits[e], self.touch[e])

    def eviction_order(self) -> list:
        """Every evictable prefix in the order the policy must evict them, one page at a time."""
        P = self.P
        locked = self.locked_entries()
        n_children: dict = {}
        for ns, pre in self.model:
            if len(pre) > P:
                parent = (ns, pre[:-P])
                n_children[parent] = n_children.get(parent, 0) + 1
        heap = [
            (self.priority(e), e) for e in self.model if e not in locked and e not in n_children
        ]
        heapq.heapify(heap)
        order = []
        while heap:
            _, e = heapq.heappop(heap)
            order.append(e)
            ns, pre = e
            if len(pre) > P:
                parent = (ns, pre[:-P])
                n_children[parent] -= 1
                if not n_children[parent] and parent not in locked:
                    heapq.heappush(heap, (self.priority(parent), parent))
        return order

    def max_unlocked_node_pages(self) -> int:
        return max(
            (len(n.pages) for n in self.cache._tree.iter_nodes() if n.lock_ref == 0), default=0
        )

    def drain_events(self) -> list:
        events = self.cache.take_events()
        self.index.apply("w", events)
        return events

    # ------------------------------------------------------------------ checked operations

    def checked_match(self, tokens, ns):
        k = self.model_match(ns, tokens)
        r = self.cache.match_prefix(tokens, extra_key=ns)
        self.clock += 1
        assert r.num_tokens == k * self.P == len(r.pages) * self.P
        entries = self.prefixes(ns, tokens, k)
        assert r.pages == [self.model[e] for e in entries]
        for e in entries:
            self.touch[e] = self.clock
            self.hits[e] += 1
        assert self.drain_events() == []  # a match never changes what is cached
        return r

    def checked_insert(self, tokens, ns, pages, known_pages: int | None = None) -> int:
        """Insert and check the return value, adopted pages and the BlockStored event.
        ``known_pages``: hand the cache the hashes of that many leading pages (as the engine
        does); its events must carry exactly the hashes it would have computed.
        Returns the number of leading pages that were already cached."""
        P = self.P
        n_full = len(tokens) // P
        k = self.model_match(ns, tokens)
        full_hashes = hash_blocks(tokens[: n_full * P], P, extra_key=ns)
        known = None if known_pages is None else full_hashes[:known_pages]
        cached = self.cache.insert(tokens, pages, extra_key=ns, block_hashes=known)
        self.clock += 1
        assert cached == k * P
        entries = self.prefixes(ns, tokens, n_full)
        for i, e in enumerate(entries):
            if i >= k:
                self.model[e] = pages[i]
                self.hashes[e] = full_hashes[i]
                self.hits[e] = 0
                self.ghost.discard(full_hashes[i])
            self.touch[e] = self.clock
        events = self.drain_events()
        if k < n_full:
            (ev,) = events
            assert isinstance(ev, BlockStored)
            assert ev.block_hashes == full_hashes[k:]
            assert ev.parent_block_hash == (full_hashes[k - 1] if k else None)
            assert ev.token_ids == list(tokens[k * P : n_full * P]) and ev.block_size == P
        else:
            assert events == []
        return k

    def checked_evict(self, num_pages: int) -> int:
        order = self.eviction_order()
        evictable = self.cache.evictable_tokens // self.P
        assert evictable == len(order)
        biggest = self.max_unlocked_node_pages()
        free_before = set(self.alloc.free_pages())
        freed = self.cache.evict(num_pages)
        assert freed >= min(num_pages, evictable)
        if freed > max(num_pages, 0):
            assert freed - num_pages < biggest  # overshoot: less than one (whole) leaf
        gone = order[:freed]
        assert set(self.alloc.free_pages()) - free_before == {self.model[e] for e in gone}
        removed_hashes = []
        for e in gone:
            del self.model[e], self.touch[e], self.hits[e]
            removed_hashes.append(self.hashes.pop(e))
        self.ghost.update(removed_hashes)
        events = self.drain_events()
        assert all(isinstance(ev, BlockRemoved) for ev in events)
        assert sorted(h for ev in events for h in ev.block_hashes) == sorted(removed_hashes)
        return freed

    def alloc_or_evict(self, n: int) -> list[int] | None:
        pages = self.alloc.alloc(n)
        if pages is None:
            assert n > self.alloc.num_free
            self.checked_evict(n - self.alloc.num_free)
            pages = self.alloc.alloc(n)
        return pages

    # ------------------------------------------------------------------ rules

    @precondition(lambda self: len(self.running) < 4)
    @rule(data=st.data(), ns=st.sampled_from(NAMESPACES), locks=st.integers(1, 2))
    def start_request(self, data, ns, locks):
        tokens = self.draw_tokens(data)
        r = self.checked_match(tokens, ns)
        for _ in range(locks):
            self.cache.lock(r.node)
        req = Request(tokens, ns, r.node, r.pages, [], locks)
        self.running.append(req)
        need = -(-len(tokens) // self.P) - len(r.pages)
        pages = self.alloc_or_evict(need)
        if pages is None:  # does not fit even after evicting: the scheduler gives up
            self.running.pop()
            for _ in range(locks):
                self.cache.unlock(r.node)
            return
        req.private = pages

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish_request(self, data):
        req = self.running.pop(data.draw(st.integers(0, len(self.running) - 1)))
        P, m = self.P, len(req.matched)
        n_full = len(req.tokens) // P
        full = req.matched + req.private[: n_full - m]
        k = self.checked_insert(req.tokens, req.extra_key, full)
        # The matched prefix was locked, so it is still cached: k >= m. Private pages in
        # [m, k) are duplicates computed in parallel; the partial tail is the caller's too.
        assert k >= m
        self.alloc.free(req.private[: k - m] + req.private[n_full - m :])
        for _ in range(req.locks):
            self.cache.unlock(req.node)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def abort_request(self, data):
        req = self.running.pop(data.draw(st.integers(0, len(self.running) - 1)))
        for _ in range(req.locks):
            self.cache.unlock(req.node)
        self.alloc.free(req.private)

    @rule(data=st.data(), ns=st.sampled_from(NAMESPACES))
    def plain_insert(self, data, ns):
        """A request that computed its whole prompt privately (no match first)."""
        tokens = self.draw_tokens(data)
        P = self.P
        pages = self.alloc_or_evict(-(-len(tokens) // P))
        if pages is None:
            return
        known = data.draw(st.none() | st.integers(0, len(tokens) // P), label="known pages")
        k = self.checked_insert(tokens, ns, pages, known)
        self.alloc.free(pages[:k] + pages[len(tokens) // P :])

    @rule(data=st.data(), ns=st.sampled_from(NAMESPACES))
    def match_only(self, data, ns):
        self.checked_match(self.draw_tokens(data), ns)

    @rule(data=st.data(), ns=st.sampled_from(NAMESPACES))
    def peek_only(self, data, ns):
        # The read-only estimate agrees with the model within the pages it is given, and
        # changes nothing: no events now, and no access time or hit count (the exact eviction
        # order checked later would differ).
        tokens = list(self.draw_tokens(data))
        hashes = hash_blocks(tokens, self.P, extra_key=ns)
        cut = data.draw(st.integers(0, len(hashes)), label="pages given")
        k = self.model_match(ns, tokens)
        assert self.cache.peek_prefix(tokens, hashes[:cut], ns) == min(k, cut) * self.P
        assert self.drain_events() == []

    @rule(n=st.integers(-1, 12))
    def evict(self, n):
        self.checked_evict(n)

    @rule(n=st.integers(0, 8))
    def scratch_alloc(self, n):
        free = self.alloc.num_free
        pages = self.alloc.alloc(n)
        if n > free:
            assert pages is None and self.alloc.num_free == free
        else:
            assert pages is not None and len(set(pages)) == n
            self.scratch.append(pages)

    @precondition(lambda self: self.scratch)
    @rule()
    def scratch_free(self):
        self.alloc.free(self.scratch.pop(0))

    @precondition(lambda self: self.alloc.num_free)
    @rule(data=st.data())
    def double_free_raises(self, data):
        page = data.draw(st.sampled_from(self.alloc.free_pages()))
        before = self.alloc.free_pages()
        with pytest.raises(ValueError):
            self.alloc.free([page])
        assert self.alloc.free_pages() == before

    @rule()
    def reset(self):
        if self.cache.protected_tokens:
            total = self.cache.total_tokens
            with pytest.raises(RuntimeError):
                self.cache.reset()
            assert self.cache.total_tokens == total and self.drain_events() == []
            return
        assert not self.locked_entries()
        free_before = self.alloc.num_free
        self.cache.reset()
        assert self.alloc.num_free == free_before + len(self.model)
        self.ghost.update(self.hashes.values())
        self.model.clear(), self.hashes.clear(), self.touch.clear(), self.hits.clear()
        events = self.drain_events()
        assert events == [AllBlocksCleared()]

    # ------------------------------------------------------------------ invariants

    @invariant()
    def integrity(self):
        c = self.cache
        c.check_integrity(held_pages=self.held_pages())
        assert c.evictable_tokens + c.protected_tokens == c.total_tokens
        assert c.total_tokens == len(self.model) * self.P
        assert c.protected_tokens == len(self.locked_entries()) * self.P
        if not self.running:
            assert c.protected_tokens == 0
        assert sorted(c.cached_pages()) == sorted(self.model.values())

    @invariant()
    def events_rebuild_the_index(self):
        self.drain_events()
        held = set(self.cache.all_block_hashes())
        assert held == set(self.hashes.values())
        assert self.index.blocks("w") == held

    @invariant()
    def ghost_list(self):
        for h in list(self.ghost)[:8]:
            assert self.cache.was_evicted([h]) == 1
        for h in list(self.hashes.values())[:8]:
            assert self.cache.was_evicted([h]) == 0


def _machine(P: int, eviction: str):
    cls = type(f"Machine_P{P}_{eviction}", (CacheMachine,), {"P": P, "EVICTION": eviction})
    case = cls.TestCase
    case.settings = CACHE_SETTINGS
    return case


TestLRUPage1 = _machine(1, "lru")
TestLRUPage4 = _machine(4, "lru")
TestLRUPage16 = _machine(16, "lru")
TestLFUPage1 = _machine(1, "lfu")
TestLFUPage4 = _machine(4, "lfu")
TestLFUPage16 = _machine(16, "lfu")
