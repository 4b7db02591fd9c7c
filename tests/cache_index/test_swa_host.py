"""The host tier of a window cache (``swa_host``): the host-tier state machine on a window model.

``TieredMachine`` (test_host_tier_properties) with a ``SWARadixCache`` over a small device pool
and window pool, a small host pool and host window pool. Window pages hold data too: a page
computed by a request writes its window page, the recorded window copies move it. Checked after
every step, besides the host tier's checks:

- a match is the brute-force reusable prefix over both tiers (a device page's window page, a
  host-only page's host window page), and the last window before its end holds exactly its
  prefix's window data, on the device after a load-back;
- every window page the tree owns, on either tier, holds its page's data;
- ``check_integrity`` covers both pools of both tiers;
- every event, group 1 included, applied in order to an ApproxIndex: a window-group store comes
  after its tier's full-group store, a demoted page's host window store before its device
  remove; the index holds exactly the tree's blocks with window pages, per tier, and predicts
  the cache's own reusable prefix over both tiers.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from radixray.cache_index import ApproxIndex, BlockRemoved, BlockStored, hash_blocks
from radixray.cache_index.swa_radix_cache import SWARadixCache
from radixray.cache_index.window_pages import WindowedAllocator

from .helpers import CACHE_SETTINGS
from .test_host_tier_properties import TieredMachine
from .test_swa_cache import brute_reusable


class SWATieredMachine(TieredMachine):
    W = 3
    DEVICE_WINDOW_PAGES = 7
    HOST_WINDOW_PAGES = 5

    def __init__(self):
        super().__init__()
        self.alloc = WindowedAllocator(self.DEVICE_PAGES, self.DEVICE_WINDOW_PAGES + 1, self.W)
        self.host_alloc = WindowedAllocator(self.HOST_PAGES, self.HOST_WINDOW_PAGES + 1, self.W)
        self.cache = SWARadixCache(
            self.P, self.alloc, self.EVICTION, enable_events=True, host_allocator=self.host_alloc
        )
        self.dwin: dict[int, tuple] = {}  # device window page -> data
        self.hwin: dict[int, tuple] = {}
        self.index = ApproxIndex(self.P)

    def settle(self) -> None:
        copies = self.cache.take_copies()
        for c in copies:
            if c.window:
                src, dst = (self.dwin, self.hwin) if c.to_host else (self.hwin, self.dwin)
                for p, v in zip(c.dst, [src[p] for p in c.src], strict=True):
                    dst[p] = v
        # the base machine checks the full pages and group 0; the index, both groups
        events = self.cache.take_events()
        self.apply_in_order(events)
        self.cache._events = [e for e in events if getattr(e, "group_idx", 0) != 1]
        self.cache.host._copies = [c for c in copies if not c.window]
        super().settle()

    def window_blocks(self) -> dict[str, set[int]]:
        """The tree's blocks with window pages, per tier."""
        out: dict[str, set[int]] = {"device": set(), "host": set()}
        for n in self.cache._tree.iter_nodes():
            for tier, pages, alloc in (("device", n.pages, self.alloc),
                                       ("host", n.host, self.host_alloc)):  # fmt: skip
                if pages:
                    has = map(alloc.has_window, pages)
                    out[tier].update(h for h, ok in zip(n.hashes, has, strict=True) if ok)
        return out

    def apply_in_order(self, events) -> None:
        host_windows = self.window_blocks()["host"]
        for ev in events:
            tier = "host" if getattr(ev, "medium", None) == "CPU" else "device"
            if isinstance(ev, BlockStored) and ev.group_idx == 1:
                assert all(self.index.holds("w", h, tier) for h in ev.block_hashes)
            if isinstance(ev, BlockRemoved) and tier == "device" and ev.group_idx == 0:
                held = self.index.window_blocks("w", "host")
                assert all(h in held for h in ev.block_hashes if h in host_windows)
            self.index.apply("w", [ev])

    def take(self, n: int) -> list[int] | None:
        if n > self.alloc.num_free + self.cache.evictable_tokens // self.P:
            return None
        if n > self.alloc.num_free:
            self.cache.evict(n - self.alloc.num_free)
            self.settle()
        if n > self.alloc.num_window_free:
            self.cache.evict_window(n - self.alloc.num_window_free)
            self.settle()
        return self.alloc.alloc(n)

    def check_match(self, m, ns, tokens) -> None:
        super().check_match(m, ns, tokens)
        full = self.cache.match_cached(tokens, ns)
        self.settle()
        flags = [self.alloc.has_window(p) for p in full.pages]
        flags += [self.host_alloc.has_window(p) for p in full.host_pages]
        e = brute_reusable(flags, self.P, self.W)
        pages, host = list(m.pages), list(m.host_pages)
        assert len(pages) + len(host) == e
        if ns is None:
            hashes = hash_blocks(list(tokens[: len(tokens) // self.P * self.P]), self.P)
            assert self.index.match_tiers(hashes).get("w", (0, 0))[1] == e
        first = max(0, e * self.P - self.W + 1) // self.P
        for i in range(first, e):
            want = self.entry(ns, tokens, i)
            if i < len(pages):
                assert self.dwin[self.alloc.window_of(pages[i])] == want
            else:
                assert self.hwin[self.host_alloc.window_of(host[i - len(pages)])] == want

    @precondition(lambda self: len(self.running) < 3)
    @rule(data=st.data(), ns=st.sampled_from([None, "lora-a"]), load=st.booleans())
    def start_request(self, data, ns, load):
        n = len(self.running)
        super().start_request(data, ns, load)
        if len(self.running) > n:
            tokens, ns, m, private = self.running[-1]
            for i, p in enumerate(private):  # the window layers' part of "compute"
                self.dwin[self.alloc.window_of(p)] = self.entry(ns, tokens, len(m.pages) + i)

    @precondition(lambda self: self.history)
    @rule(data=st.data())
    def resume(self, data):
        """A conversation continues where one ended: its whole prompt and a little more."""
        src = data.draw(st.sampled_from(self.history))
        self._forced = src + (1,) * data.draw(st.integers(1, 2 * self.P))
        self.start_request(data, None, True)

    def draw_tokens(self, data) -> tuple[int, ...]:
        forced, self._forced = getattr(self, "_forced", None), None
        return forced if forced is not None else super().draw_tokens(data)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def trim_window(self, data):
        """A request past its prompt drops its private pages' window pages out of its window."""
        tokens, ns, m, private = data.draw(st.sampled_from(self.running))
        upto = max(0, len(tokens) - self.W + 1) // self.P - len(m.pages)
        self.alloc.drop_window(private[: max(0, upto)])

    @rule(n=st.integers(0, 6))
    def evict_window(self, n):
        self.cache.evict_window(n)
        self.settle()

    @invariant()
    def index_window_residency(self):
        self.settle()
        if self.index.window_of("w") is not None:
            blocks = self.window_blocks()
            for tier in ("device", "host"):
                assert self.index.window_blocks("w", tier) == blocks[tier], tier

    @invariant()
    def window_data(self):
        stack = [(r, ns, ()) for ns, r in self.cache._tree.roots().items()]
        while stack:
            node, ns, prefix = stack.pop()
            prefix = prefix + tuple(node.key)
            start = len(prefix) // self.P - len(node.hashes)
            for j in range(len(node.hashes)):
                want = (ns, prefix[: (start + j + 1) * self.P])
                if node.pages and self.alloc.has_window(node.pages[j]):
                    assert self.dwin[self.alloc.window_of(node.pages[j])] == want
                if node.host and self.host_alloc.has_window(node.host[j]):
                    assert self.hwin[self.host_alloc.window_of(node.host[j])] == want
            stack.extend((c, ns, prefix) for c in node.children.values())


def _machine(P: int, eviction: str, host_pages: int = 8, w: int = 3):
    attrs = {"P": P, "EVICTION": eviction, "HOST_PAGES": host_pages, "W": w}
    cls = type(f"SWATiered_P{P}_{eviction}_host{host_pages}_w{w}", (SWATieredMachine,), attrs)
    case = cls.TestCase
    case.settings = CACHE_SETTINGS
    return case


TestSWATieredP1 = _machine(1, "lru")
TestSWATieredP2 = _machine(2, "lru", w=5)
TestSWATieredLFU = _machine(2, "lfu", w=3)
TestSWATieredTinyHost = _machine(1, "lru", host_pages=2, w=2)
