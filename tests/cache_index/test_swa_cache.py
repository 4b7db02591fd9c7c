"""SWARadixCache, WindowedAllocator and the router's window-aware index (docs/window_cache.md).

The state machine plays a scheduler against one SWARadixCache over a window pool: requests
match, lock, take pages (evicting full pages or window pages as need be), drop the window pages
out of their window as they run, and finish (insert, revive, free duplicates) or abort. After
every step:

- a match is exactly the reusable prefix, computed by brute force from the full match and the
  allocator's window pages: the largest ``e`` with every page holding a position in
  ``[e*P - W + 1, e*P)`` present; the rest is ``window_tokens``;
- nothing another request holds loses its window page; ``check_integrity`` covers both pools;
- the events, applied to an ApproxIndex, give exactly the cached blocks, exactly the blocks
  with window pages, and a prediction equal to the cache's own match.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from radixray.cache_index import ApproxIndex, BlockRemoved, BlockStored, hash_blocks
from radixray.cache_index.swa_radix_cache import SWARadixCache
from radixray.cache_index.window_pages import WindowedAllocator, reusable_pages

from .helpers import CACHE_SETTINGS

P, W = 2, 5  # a window spans parts of three pages


def brute_reusable(present: list[bool], P: int, W: int) -> int:
    for e in range(len(present), 0, -1):
        if all(present[max(0, e * P - W + 1) // P : e]):
            return e
    return 0


@CACHE_SETTINGS
@given(st.lists(st.booleans(), max_size=12), st.integers(1, 4), st.integers(1, 13))
def test_reusable_pages_is_the_brute_force_answer(present, P, W):
    got = reusable_pages(list(range(len(present))), present.__getitem__, P, W)
    assert got == brute_reusable(present, P, W)


def test_windowed_allocator_pairs_and_drops():
    a = WindowedAllocator(4, 3, W)  # two window pages besides NULL
    assert a.alloc(3) is None and a.num_free == 4  # not enough window pages: nothing taken
    p = a.alloc(2)
    assert all(map(a.has_window, p)) and a.window_table(p) == [1, 2]
    assert a.drop_window([p[0]]) == 1 and a.window_table(p) == [0, 2]
    q = a.alloc(1)
    assert a.window_table(q) == [1] and a.move_window(q[0], p[0]) and not a.has_window(q[0])
    a.free(p + q)
    a.check_window()
    assert a.num_free == 4 and a.num_window_free == 2


def _cache(num_pages=16, window_pages=12, **kw):
    alloc = WindowedAllocator(num_pages, window_pages + 1, W)
    return SWARadixCache(P, alloc, enable_events=True, **kw), alloc


def test_match_stops_where_the_window_is_gone_and_eviction_keeps_the_end():
    cache, alloc = _cache()
    toks = list(range(12))  # 6 pages
    pages = alloc.alloc(6)
    alloc.drop_window(pages[:2])  # a request dropped them as it ran
    assert cache.insert(toks, pages) == 0
    assert cache.match_prefix(toks).num_tokens == 12
    m = cache.match_prefix(toks[:5])  # 2 pages present in full, window before it gone
    assert (m.num_tokens, m.window_tokens) == (0, 4)
    assert cache.match_prefix(toks[:9]).num_tokens == 8  # pages 1..3 hold [4, 8): page 1 gone
    # window eviction drops what lies more than a window before the end first
    assert cache.evict_window(1) == 1 and not alloc.has_window(pages[2])
    assert cache.match_prefix(toks).num_tokens == 12
    assert cache.evict_window(10) == 3 and cache.match_prefix(toks).num_tokens == 0
    cache.check_integrity(held_pages=[])
    with pytest.raises(TypeError, match="WindowedAllocator"):
        SWARadixCache(P, alloc, host_allocator=object())  # host pages need host windows


def test_a_request_drops_cached_window_pages_only_where_it_alone_holds_them():
    cache, alloc = _cache()
    toks = list(range(12))
    pages = alloc.alloc(6)
    cache.insert(toks, pages)
    a = cache.match_prefix(toks)
    cache.lock(a.node)
    b = cache.match_prefix(toks[:8])  # another request on the first four pages
    cache.lock(b.node)
    assert cache.drop_window_held(a.node, 0, 6) == 2  # pages 4, 5: only a holds them
    assert [alloc.has_window(p) for p in pages] == [True] * 4 + [False] * 2
    cache.unlock(b.node)
    assert cache.drop_window_held(a.node, 0, 6) == 4
    cache.unlock(a.node)
    assert cache.window_evictable() == 0 and cache.match_prefix(toks).num_tokens == 0
    # a request that recomputed the pages gives them their window pages back
    dups = alloc.alloc(6)
    node = cache.match_cached(toks).node
    cache.revive_window(node, 0, dups)
    alloc.free(dups)
    assert cache.match_prefix(toks).num_tokens == 12
    cache.check_integrity(held_pages=[])


def test_index_predicts_only_the_reusable_prefix():
    cache, alloc = _cache()
    index = ApproxIndex(P)
    toks = list(range(12))
    pages = alloc.alloc(6)
    cache.insert(toks, pages)
    index.apply("w", cache.take_events())
    index.insert("plain", hash_blocks(toks, P))  # a worker without windows
    hashes = hash_blocks(toks, P)
    assert index.window_of("w") == W and index.window_of("plain") is None
    assert index.match(hashes) == {"w": 6, "plain": 6}
    alloc_before = set(index.blocks("w"))
    cache.evict_window(3)  # the first three pages lose their window pages
    events = cache.take_events()
    assert all(isinstance(e, BlockRemoved) and e.kind == "sliding_window" for e in events)
    index.apply("w", events)
    assert index.blocks("w") == alloc_before  # full blocks stay
    assert index.match(hashes[:3]) == {"plain": 3}  # "w" holds them, without their window
    assert index.match(hashes) == {"w": 6, "plain": 6}
    assert index.prefix_on("w", hashes[:4]) == 0 and index.longest_match(hashes[:4]) == 4
    assert index.match_tiers(hashes[:4]) == {"plain": (4, 4)}
    snap = ApproxIndex(P)
    snap.apply("w", cache.snapshot_events())
    assert snap.match(hashes[:3]) == {} and snap.match(hashes) == {"w": 6}


class SWAMachine(RuleBasedStateMachine):
    NUM_PAGES, WINDOW_PAGES = 24, 10

    def __init__(self):
        super().__init__()
        self.alloc = WindowedAllocator(self.NUM_PAGES, self.WINDOW_PAGES + 1, W)
        self.cache = SWARadixCache(P, self.alloc, enable_events=True)
        self.index = ApproxIndex(P)
        self.running: list[dict] = []
        self.history: list[list[int]] = []

    def draw_tokens(self, data) -> list[int]:
        base: list[int] = []
        if self.history and data.draw(st.booleans(), label="share"):
            src = data.draw(st.sampled_from(self.history), label="src")
            base = src[: data.draw(st.integers(0, len(src)), label="cut")]
        rng = random.Random(data.draw(st.integers(0, 1 << 16), label="seed"))
        toks = base + [rng.randrange(3) for _ in range(data.draw(st.integers(0, 12)))]
        self.history = (self.history + [toks])[-6:]
        return toks

    def locked_windows(self, skip=None) -> dict[int, bool]:
        return {
            p: self.alloc.has_window(p) for r in self.running if r is not skip for p in r["tree"]
        }

    def checked_match(self, toks):
        full = self.cache.match_cached(toks)
        e = brute_reusable([self.alloc.has_window(p) for p in full.pages], P, W)
        hashes = hash_blocks(toks[: len(toks) // P * P], P)
        assert self.cache.peek_prefix(toks, hashes) == e * P
        m = self.cache.match_prefix(toks)
        assert m.pages == full.pages[:e] and m.num_tokens == e * P
        assert m.window_tokens == (len(full.pages) - e) * P
        hashes = hash_blocks(toks[: len(toks) // P * P], P)
        self.drain()
        assert self.index.prefix_on("w", hashes) == e
        return m

    def take(self, n: int) -> list[int] | None:
        if n > self.alloc.num_free:
            self.cache.evict(n - self.alloc.num_free)
        if n > self.alloc.num_window_free:
            before = self.locked_windows()
            could = self.cache.window_evictable()
            short = n - self.alloc.num_window_free
            freed = self.cache.evict_window(short)
            assert freed >= min(short, could)
            assert self.locked_windows() == before  # nothing held loses its window page
        return self.alloc.alloc(n)

    @rule(data=st.data())
    def start(self, data):
        self._start(self.draw_tokens(data))

    def _start(self, toks: list[int]) -> None:
        m = self.checked_match(toks)
        self.cache.lock(m.node)
        private = self.take(-(-len(toks) // P) - len(m.pages))
        if private is None:
            self.cache.unlock(m.node)
            return
        self.running.append(
            {"toks": toks, "node": m.node, "tree": m.pages, "private": private, "start": 0}
        )

    @rule(data=st.data())
    def cache_and_share(self, data):
        """A prompt cached whole (every window page there), then two requests on it."""
        toks = self.draw_tokens(data)
        k = len(toks) // P
        pages = self.take(k)
        if pages is None:
            return
        self.alloc.free(pages[: self.cache.insert(toks, pages) // P])  # duplicates
        self._start(toks)
        self._start(toks + [data.draw(st.integers(0, 2))] * data.draw(st.integers(0, 4)))

    @rule(data=st.data())
    def advance(self, data):
        """A request's computed tokens pass a point: it drops what is out of its window."""
        if not self.running:
            return
        r = data.draw(st.sampled_from(self.running))
        c = data.draw(st.integers(len(r["tree"]) * P, len(r["toks"])))
        upto = max(0, c - W + 1) // P
        ntp = len(r["tree"])
        others = self.locked_windows(skip=r)
        self.alloc.drop_window(r["private"][max(0, r["start"] - ntp) : max(0, upto - ntp)])
        if r["start"] < ntp:
            self.cache.drop_window_held(r["node"], r["start"], min(upto, ntp))
        r["start"] = max(r["start"], upto)
        # pages other requests hold keep their window pages, shared with this one or not
        assert {p: self.alloc.has_window(p) for p in others} == others

    @rule(data=st.data())
    def finish(self, data):
        if not self.running:
            return
        r = data.draw(st.sampled_from(self.running))
        self.running.remove(r)
        toks, ntp = r["toks"], len(r["tree"])
        k = len(toks) // P
        pages = r["tree"] + r["private"]
        cached = self.cache.insert(toks, pages[:k])
        dups = pages[ntp : max(ntp, min(cached // P, k))]
        if dups:
            node = self.cache.match_cached(toks[: k * P]).node
            self.cache.revive_window(node, ntp, dups)
        self.alloc.free(dups + pages[k:])
        self.cache.unlock(r["node"])

    @rule(data=st.data())
    def abort(self, data):
        if self.running:
            r = data.draw(st.sampled_from(self.running))
            self.running.remove(r)
            self.alloc.free(r["private"])
            self.cache.unlock(r["node"])

    @rule(n=st.integers(0, 8))
    def evict(self, n):
        self.cache.evict(n)

    @rule(n=st.integers(0, 8))
    def evict_window(self, n):
        self.take(0)
        before, could = self.locked_windows(), self.cache.window_evictable()
        assert self.cache.evict_window(n) >= min(n, could)
        assert self.locked_windows() == before

    def drain(self):
        events = self.cache.take_events()
        for ev in events:
            if isinstance(ev, (BlockStored, BlockRemoved)) and ev.kind == "sliding_window":
                assert ev.group_idx == 1 and ev.window == W
        self.index.apply("w", events)

    @invariant()
    def integrity(self):
        self.cache.check_integrity(held_pages=[p for r in self.running for p in r["private"]])

    @invariant()
    def events_give_both_groups(self):
        self.drain()
        nodes = list(self.cache._tree.iter_nodes())
        blocks = {h: p for n in nodes for h, p in zip(n.hashes, n.pages, strict=True)}
        assert self.index.blocks("w") == set(blocks)
        if self.index.window_of("w") is not None:
            held = self.index.window_blocks("w")
            assert held == {h for h, p in blocks.items() if self.alloc.has_window(p)}


TestSWAMachine = SWAMachine.TestCase
TestSWAMachine.settings = CACHE_SETTINGS
