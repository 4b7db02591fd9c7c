"""Property tests of the host tier: random traffic against a RadixCache with a small device pool
and a small host pool, so demotions, load-backs and both evictions happen all the time.

The machine plays the scheduler and the engine. Pages hold "data": every page a request computes
is written with the (namespace, prefix) it holds, and the copies the cache records are applied to
those contents, in order, right after each operation (the engine runs them before its next
forward). Checked after every step:

- a match's device pages hold exactly its prefix's pages, its host pages exactly the
  continuation's, and after a load-back the device pages hold them too (copies in the right
  order, nothing overwritten before it was copied out);
- ``check_integrity`` (both tiers' page accounting, counters, leaf sets, device closure);
- the events, applied in order to per-tier residency sets, give exactly what the tree holds;
  a device remove of a block the host keeps comes after its host store;
- the ghost list knows every block gone from both tiers;
- the host tier forgets a host-only prefix only when no unlocked host copy of a device-resident
  node is left to drop (dropping one loses nothing: the node stays on the device).
"""

from __future__ import annotations

import random

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixray.cache_index import BlockRemoved, BlockStored, PageAllocator, RadixCache

from .helpers import CACHE_SETTINGS

NAMESPACES = [None, "lora-a"]


class TieredMachine(RuleBasedStateMachine):
    P = 2
    EVICTION = "lru"
    DEVICE_PAGES = 10
    HOST_PAGES = 8
    MAX_FULL_PAGES = 5
    WRITE_THROUGH = None  # host_write_through_hits

    def __init__(self):
        super().__init__()
        self.alloc = PageAllocator(self.DEVICE_PAGES)
        self.host_alloc = PageAllocator(self.HOST_PAGES)
        self.cache = RadixCache(
            self.P,
            self.alloc,
            self.EVICTION,
            enable_events=True,
            host_allocator=self.host_alloc,
            host_write_through_hits=self.WRITE_THROUGH,
        )
        self.device: dict[int, tuple] = {}  # device page -> (ns, prefix) it holds
        self.host: dict[int, tuple] = {}
        self.gpu: set[int] = set()  # residency from events
        self.cpu: set[int] = set()
        self.running: list[tuple] = []  # (node, private pages)
        self.history: list[tuple[int, ...]] = []
        forget = self.cache.host.forget

        def forget_checked(node):
            assert not self.cache._tree.host_copies, "a prefix forgotten, a host copy kept"
            forget(node)

        self.cache.host.forget = forget_checked

    def draw_tokens(self, data) -> tuple[int, ...]:
        base: tuple[int, ...] = ()
        if self.history:
            i = data.draw(st.integers(0, len(self.history)), label="base")
            if i < len(self.history):
                src = self.history[i]
                base = src[: data.draw(st.integers(0, len(src)), label="cut")]
        max_len = self.MAX_FULL_PAGES * self.P + self.P - 1
        extra = data.draw(st.integers(0, max(0, max_len - len(base))), label="extra")
        rng = random.Random(data.draw(st.integers(0, 1 << 16), label="seed"))
        toks = base + tuple(rng.randrange(2) for _ in range(extra))
        self.history = (self.history + [toks])[-8:]
        return toks

    def entry(self, ns, tokens, i):
        return (ns, tuple(tokens[: (i + 1) * self.P]))

    def settle(self) -> None:
        """Run the recorded copies on the page contents and apply the events."""
        for c in self.cache.take_copies():
            src, dst = (self.device, self.host) if c.to_host else (self.host, self.device)
            vals = [src[p] for p in c.src]
            for p, v in zip(c.dst, vals, strict=True):
                dst[p] = v
        tree_host = {h for n in self.cache._tree.iter_nodes() if n.host for h in n.hashes}
        for ev in self.cache.take_events():
            if isinstance(ev, BlockStored):
                (self.gpu if ev.medium == "GPU" else self.cpu).update(ev.block_hashes)
            elif isinstance(ev, BlockRemoved):
                if ev.medium == "GPU":
                    for h in ev.block_hashes:
                        assert h not in tree_host or h in self.cpu, "device remove before store"
                    self.gpu.difference_update(ev.block_hashes)
                else:
                    self.cpu.difference_update(ev.block_hashes)
            else:
                self.gpu.clear(), self.cpu.clear()

    def take(self, n: int) -> list[int] | None:
        if n > self.alloc.num_free:
            if n > self.alloc.num_free + self.cache.evictable_tokens // self.P:
                return None
            self.cache.evict(n - self.alloc.num_free)
            self.settle()
        return self.alloc.alloc(n)

    def check_match(self, m, ns, tokens) -> None:
        k = len(m.pages)
        for i, p in enumerate(m.pages):
            assert self.device[p] == self.entry(ns, tokens, i)
        for i, p in enumerate(m.host_pages):
            assert self.host[p] == self.entry(ns, tokens, k + i)
        assert m.host_tokens == len(m.host_pages) * self.P

    @precondition(lambda self: len(self.running) < 3)
    @rule(data=st.data(), ns=st.sampled_from(NAMESPACES), load=st.booleans())
    def start_request(self, data, ns, load):
        tokens = self.draw_tokens(data)
        m = self.cache.match_prefix(tokens, ns)
        self.settle()
        self.check_match(m, ns, tokens)
        if load and m.host_pages:
            self.cache.lock(m.host_node)
            self.settle()  # a write-through on lock records copies and events
            pages = self.take(len(m.host_pages))
            if pages is None:
                self.cache.unlock(m.host_node)
                return
            m = self.cache.load_back(m, pages)
            self.settle()
            self.check_match(m, ns, tokens)
            assert len(self.cache.match_prefix(tokens, ns).pages) >= len(m.pages)
            self.settle()
        else:
            self.cache.lock(m.node)
            self.settle()
        need = -(-len(tokens) // self.P) - len(m.pages)
        private = self.take(need)
        if private is None:
            self.cache.unlock(m.node)
            return
        for i, p in enumerate(private):  # "compute" the pages
            self.device[p] = self.entry(ns, tokens, len(m.pages) + i)
        self.running.append((tokens, ns, m, private))

    @precondition(lambda self: self.running)
    @rule(data=st.data(), abort=st.booleans())
    def finish_request(self, data, abort):
        tokens, ns, m, private = self.running.pop(data.draw(st.integers(0, len(self.running) - 1)))
        n_full, k0 = len(tokens) // self.P, len(m.pages)
        if abort:
            self.cache.unlock(m.node)
            self.alloc.free(private)
        else:
            cached = self.cache.insert(tokens, list(m.pages) + private[: n_full - k0], ns)
            k = cached // self.P
            assert k >= k0
            self.alloc.free(private[: k - k0] + private[n_full - k0 :])
            self.cache.unlock(m.node)
        self.settle()

    @precondition(lambda self: self.history)
    @rule(data=st.data(), ns=st.sampled_from(NAMESPACES))
    def load_back_recent(self, data, ns):
        """A recent prompt's host continuation loaded back and released, then device pages
        evicted: the loaded nodes, on both tiers and the most recently used, keep their device
        pages while older nodes are demoted, and their host copies are dropped to make room."""
        tokens = self.history[data.draw(st.integers(0, len(self.history) - 1), label="recent")]
        m = self.cache.match_prefix(tokens, ns)
        self.settle()
        if m.pages and not m.host_pages:  # demote it (and every other unlocked device node)
            self.cache.evict(self.cache.evictable_tokens // self.P)
            m = self.cache.match_prefix(tokens, ns)
            self.settle()
        if not m.host_pages:
            return
        self.cache.lock(m.host_node)
        self.settle()
        pages = self.take(len(m.host_pages))
        if pages is not None:
            m = self.cache.load_back(m, pages)
            self.settle()
            self.check_match(m, ns, tokens)
        self.cache.unlock(m.host_node if pages is None else m.node)
        self.settle()
        self.evict(data.draw(st.integers(0, 8), label="then evict"))  # others first: LRU

    @rule(n=st.integers(0, 8))
    def host_pressure(self, n):
        """The host tier frees ``n`` pages (as a demotion or write-through would): host copies
        of device-resident nodes first, then host-only leaves."""
        ok = self.cache.host.make_room(n)
        assert ok == (self.host_alloc.num_free >= n)
        self.settle()

    @rule(n=st.integers(0, 8))
    def evict(self, n):
        before = self.cache.evictable_tokens // self.P
        freed = self.cache.evict(n)
        assert freed >= min(n, before)
        self.settle()

    @rule(data=st.data(), ns=st.sampled_from(NAMESPACES))
    def match_only(self, data, ns):
        tokens = self.draw_tokens(data)
        m = self.cache.match_prefix(tokens, ns)
        self.settle()
        self.check_match(m, ns, tokens)

    @rule()
    def reset(self):
        if not self.cache.protected_tokens and not self.running:
            self.cache.reset()
            self.settle()
            assert self.host_alloc.num_free == self.HOST_PAGES

    @invariant()
    def integrity(self):
        held = [p for *_, private in self.running for p in private]
        self.cache.check_integrity(held_pages=held)
        nodes = list(self.cache._tree.iter_nodes())
        assert self.gpu == {h for n in nodes if n.pages for h in n.hashes}
        assert self.cpu == {h for n in nodes if n.host for h in n.hashes}
        assert sorted(self.cache.cached_host_pages()) == sorted(
            set(range(self.HOST_PAGES)) - set(self.host_alloc.free_pages())
        )
        for n in nodes[:8]:
            assert self.cache.was_evicted(n.hashes[:1]) == 0


def _machine(P: int, eviction: str, host_pages: int = TieredMachine.HOST_PAGES, write_through=None,
             device_pages: int = TieredMachine.DEVICE_PAGES):  # fmt: skip
    attrs = {"P": P, "EVICTION": eviction, "HOST_PAGES": host_pages, "WRITE_THROUGH": write_through}
    attrs["DEVICE_PAGES"] = device_pages
    name = f"Tiered_P{P}_{eviction}_dev{device_pages}_host{host_pages}_wt{write_through}"
    cls = type(name, (TieredMachine,), attrs)
    case = cls.TestCase
    case.settings = CACHE_SETTINGS
    return case


TestTieredLRUPage1 = _machine(1, "lru")
TestTieredLRUPage2 = _machine(2, "lru")
TestTieredLFUPage4 = _machine(4, "lfu")
# a host tier too small for many nodes: demotions find no room and forget, subtrees and all
TestTieredTinyHost = _machine(1, "lru", host_pages=2)
# write-through after 1 and 2 hits: copies to host on lock, demotions of copied nodes copy nothing
TestTieredWriteThrough1 = _machine(2, "lru", write_through=1)
TestTieredWriteThrough2TinyHost = _machine(1, "lru", host_pages=3, write_through=2)
# a host tier smaller than the device pool: loaded-back nodes' host copies fill it and are dropped
TestTieredHostCopies = _machine(1, "lru", host_pages=4, device_pages=6)
