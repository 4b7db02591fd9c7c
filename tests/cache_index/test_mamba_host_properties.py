"""Property tests: random traffic against a MambaRadixCache with a host tier (``mamba_host``).

The machine plays a hybrid model's scheduler and its device: every page and state slot, on
either tier, holds a *value* (the token prefix whose KV or state it holds), and the cache's
recorded copies are run on those values in order, as the engine runs them before its next
forward. A request matches, loads the host continuation back when the pages fit (else starts
from ``device_part``), "restores" the named checkpoint, computes the rest, checkpoints at
random page ends and inserts; KV, state and host evictions are mixed in, with a tiny pool on
every tier.

Checked after every step: a match's pages and checkpoint (device or host slot) hold exactly
the prefix they claim once the copies recorded so far have run; the four pools' accounting
(``check_integrity``); and the index built from the events holds the cache's blocks per tier
and its checkpoints per tier.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from radixray.cache_index import ApproxIndex, PageAllocator
from radixray.cache_index.mamba_radix_cache import MambaRadixCache

from .helpers import CACHE_SETTINGS

P = 2
tokens_st = st.lists(st.integers(1, 2), min_size=1, max_size=10)


class MambaHostMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.alloc, self.states = PageAllocator(10), PageAllocator(4)
        self.host_pages, self.host_slots = PageAllocator(6), PageAllocator(2)
        self.cache = MambaRadixCache(
            P, self.alloc, self.states, enable_events=True,
            host_allocator=self.host_pages, host_state_allocator=self.host_slots,
        )  # fmt: skip
        self.index = ApproxIndex(P)
        # what each page / slot holds: (kind, tier, id) -> token prefix
        self.value: dict[tuple[str, str, int], tuple] = {}

    def run_copies(self) -> None:
        """The engine's part: the recorded copies, in order, on the values."""
        for c in self.cache.take_copies():
            kind = "state" if c.state else "kv"
            a, b = ("dev", "host") if c.to_host else ("host", "dev")
            for s, d in zip(c.src, c.dst, strict=True):
                self.value[(kind, b, d)] = self.value.get((kind, a, s))

    def check_match(self, tokens, m) -> None:
        """``m``'s pages and checkpoint hold what it says (after the copies recorded so far)."""
        self.run_copies()
        for j, p in enumerate(m.pages):
            assert self.value.get(("kv", "dev", p)) == tuple(tokens[: (j + 1) * P])
        for j, p in enumerate(m.host_pages):
            want = tuple(tokens[: m.num_tokens + (j + 1) * P])
            assert self.value.get(("kv", "host", p)) == want
        if m.state_slot is not None:
            end = m.num_tokens + m.host_tokens
            tier = "host" if m.state_host else "dev"
            assert self.value.get(("state", tier, m.state_slot)) == tuple(tokens[:end])

    def take(self, n: int) -> list[int] | None:
        if n > self.alloc.num_free:
            self.cache.evict(n - self.alloc.num_free)
        return self.alloc.alloc(n)

    def slot(self) -> int | None:
        got = self.states.alloc(1)
        if got is None and self.cache.evict_states(1):
            got = self.states.alloc(1)
        return got[0] if got else None

    @rule(tokens=tokens_st, marks=st.lists(st.booleans(), min_size=1, max_size=4))
    def request(self, tokens, marks):
        cache = self.cache
        m = cache.match_prefix(tokens[:-1])
        self.check_match(tokens, m)
        node = m.host_node or m.node
        cache.lock(node)
        mine = self.slot()
        n = len(tokens) // P * P
        pages = None
        if mine is not None and m.host_node is not None:
            loaded = self.take(len(m.host_pages))
            if loaded is not None:
                m = cache.load_back(m, loaded)
                self.check_match(tokens, m)
        if m.host_node is not None:  # not loaded: start from the device's part
            cache.unlock(node)
            m = cache.device_part(m)
            node = m.node
            cache.lock(node)
        if mine is not None:
            pages = self.take(n // P - len(m.pages))
        if pages is None:
            cache.unlock(node)
            if mine is not None:
                self.states.free([mine])
            return
        pages = list(m.pages) + pages
        states = {}
        for p in range(m.num_tokens + P, n + 1, P):
            if marks[(p // P) % len(marks)] or p == n:
                s = self.slot()
                if s is not None:
                    states[p] = s
        self.run_copies()  # before the forward: then it writes what it computes
        self.value[("state", "dev", mine)] = tuple(tokens[: m.num_tokens])  # the restore
        for p in range(m.num_tokens + P, n + 1, P):
            self.value[("kv", "dev", pages[p // P - 1])] = tuple(tokens[:p])
            if p in states:
                self.value[("state", "dev", states[p])] = tuple(tokens[:p])
        last = max(states, default=m.num_tokens)
        cached = cache.insert(tokens[:last], pages[: last // P], states=states)
        k = len(m.pages)
        self.alloc.free(pages[k : max(k, cached // P)] + pages[last // P :])
        cache.unlock(node)
        self.states.free([mine])

    @rule(n=st.integers(0, 6))
    def evict(self, n):
        self.cache.evict(n)

    @rule(n=st.integers(0, 3))
    def evict_states(self, n):
        self.cache.evict_states(n)

    @rule(n=st.integers(0, 6))
    def host_room(self, n):
        self.cache.make_host_room(min(n, self.host_pages.num_pages))

    @invariant()
    def integrity(self):
        self.cache.check_integrity(held_pages=[], held_slots=[])

    @invariant()
    def index_agrees(self):
        """The index from the events holds the cache's blocks and checkpoints, per tier."""
        cache, index = self.cache, self.index
        index.apply("w", cache.take_events())
        nodes = list(cache._tree.iter_nodes())
        assert index.blocks("w") == {h for n in nodes if n.pages for h in n.hashes}
        assert index.blocks("w", "host") == {h for n in nodes if n.host for h in n.hashes}
        for tier, ckpt in (("device", cache._ckpt), ("host", cache.host.ckpt)):
            assert (index._states.held("w", tier) or set()) == {n.hashes[-1] for n in ckpt.slot}


TestMambaHostMachine = MambaHostMachine.TestCase
TestMambaHostMachine.settings = CACHE_SETTINGS
