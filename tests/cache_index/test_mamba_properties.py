"""Property tests: random request traffic against one MambaRadixCache, checked after every step.

The machine plays a scheduler of a hybrid model. A request matches, locks the path and the
matched checkpoint, takes pages for the rest (evicting the shortfall), "copies" the state and
unlocks the checkpoint, checkpoints at random page ends of what it computed (taking slots,
evicting checkpoints when the state pool is short; a checkpoint it cannot get is skipped), then
inserts up to its last checkpoint and frees what the cache did not take. Some requests stay
running (their locks held) while others come and go; KV and checkpoint evictions are mixed in.

A reference model predicts every match and insert exactly: ``kv`` maps each cached
page-aligned prefix to its page, ``ckpt`` each checkpointed prefix to its slot. A match must
return the pages up to the deepest checkpointed prefix within the longest cached one, that
checkpoint's slot, and the cached tokens past it; an insert must report the cached length.
Evictions are checked by what they must do (free at least the shortfall of what is evictable,
never touch what running requests hold) and the model is then read back from the tree.

Events: every step's KV events (both groups) go to an ApproxIndex, which must hold exactly the
cache's blocks and checkpointed blocks, and whose match must equal the cache's usable prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixray.cache_index import ApproxIndex, PageAllocator, hash_blocks
from radixray.cache_index.mamba_radix_cache import MambaRadixCache

from .helpers import CACHE_SETTINGS

P = 2
tokens_st = st.lists(st.integers(1, 2), min_size=1, max_size=10)


@dataclass
class Running:
    tokens: tuple[int, ...]
    node: object
    pages: list[int]
    slot: int | None


class MambaCacheMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.alloc = PageAllocator(14)
        self.states = PageAllocator(5)
        self.cache = MambaRadixCache(P, self.alloc, self.states, enable_events=True)
        self.index = ApproxIndex(P)
        self.kv: dict[tuple, int] = {}
        self.ckpt: dict[tuple, int] = {}
        self.running: list[Running] = []

    # ---------------------------------------------------------------- the model

    def predict(self, tokens: list[int]) -> tuple[list[int], int, int | None, int]:
        kv_len = 0
        while kv_len + P <= len(tokens) and tuple(tokens[: kv_len + P]) in self.kv:
            kv_len += P
        use = max((p for p in range(P, kv_len + 1, P) if tuple(tokens[:p]) in self.ckpt), default=0)
        pages = [self.kv[tuple(tokens[: p + P])] for p in range(0, use, P)]
        return pages, use, self.ckpt.get(tuple(tokens[:use])), kv_len - use

    def resync(self) -> None:
        """Read the model back from the tree (after an eviction)."""
        self.kv.clear()
        self.ckpt.clear()
        for root in self.cache._tree.roots().values():
            stack = [(c, ()) for c in root.children.values()]
            while stack:
                node, prefix = stack.pop()
                for j, page in enumerate(node.pages):
                    self.kv[prefix + tuple(node.key[: (j + 1) * P])] = page
                end = prefix + tuple(node.key)
                if self.cache.state_at(node) is not None:
                    self.ckpt[end] = self.cache.state_at(node)
                stack += [(c, end) for c in node.children.values()]

    def held(self) -> None:
        """What running requests hold is still cached: their pages and checkpoint."""
        for r in self.running:
            m = self.cache.match_prefix(list(r.tokens) + [0])
            assert m.pages[: len(r.pages)] == r.pages and m.num_tokens >= len(r.pages) * P

    # ---------------------------------------------------------------- traffic

    def admit(self, tokens: list[int]) -> Running | None:
        """Match, lock, restore: a running request at its usable prefix (None: no room)."""
        expect = self.predict(tokens[: len(tokens) - 1])
        m = self.cache.match_prefix(tokens[: len(tokens) - 1])
        assert (m.pages, m.num_tokens, m.state_slot, m.state_tokens) == expect
        self.cache.lock(m.node)
        if m.state_slot is not None:
            self.cache.lock_state(m.node)
        slot = self.take_slot()
        if m.state_slot is not None:
            self.cache.unlock_state(m.node)  # the copy into ``slot`` is done
        if not slot:
            self.cache.unlock(m.node)
            return None
        return Running(tuple(tokens), m.node, list(m.pages), slot[0])

    def take_slot(self) -> list[int] | None:
        """A state slot, evicting a checkpoint when none is free (None: none evictable)."""
        slot = self.states.alloc(1)
        if slot is None and self.cache.evict_states(1):
            self.resync()
            slot = self.states.alloc(1)
        return slot

    def compute(self, r: Running, marks: list[bool]) -> None:
        """Compute the rest, checkpoint at the marked page ends, insert, free, unlock."""
        cache, alloc = self.cache, self.alloc
        n = len(r.tokens) // P * P
        need = n // P - len(r.pages)
        if need > alloc.num_free:
            before = cache.evictable_tokens // P
            freed = cache.evict(need - alloc.num_free)
            assert freed >= min(need - alloc.num_free, before)
            self.resync()
            self.held()
        own = alloc.alloc(need)
        if own is None:
            return self.end(r, [])
        states: dict[int, int] = {}
        for p in range(len(r.pages) * P + P, n + 1, P):
            if marks[(p // P) % len(marks)] or p == n:
                s = self.take_slot()
                if s:
                    states[p] = s[0]
        self.resync()
        self.held()
        last = max(states, default=len(r.pages) * P)
        expect = self._kv_len(r.tokens[:last])  # KV cached before, checkpoint or not
        pages = r.pages + own
        cached = cache.insert(r.tokens[:last], pages[: last // P], states=states)
        assert cached == expect
        k = len(r.pages)
        alloc.free(pages[k : max(k, cached // P)] + pages[last // P :])
        for p, s in states.items():
            self.ckpt.setdefault(r.tokens[:p], s)
        for p in range(P, last + 1, P):
            self.kv.setdefault(r.tokens[:p], pages[p // P - 1])
        self.end(r, [])

    def _kv_len(self, tokens) -> int:
        n = 0
        while n + P <= len(tokens) and tuple(tokens[: n + P]) in self.kv:
            n += P
        return n

    def end(self, r: Running, _):
        self.cache.unlock(r.node)
        if r.slot is not None:
            self.states.free([r.slot])
            r.slot = None

    @rule(tokens=tokens_st, marks=st.lists(st.booleans(), min_size=1, max_size=4))
    def request(self, tokens, marks):
        r = self.admit(tokens)
        if r is not None:
            self.compute(r, marks)

    @precondition(lambda self: len(self.running) < 2)
    @rule(tokens=tokens_st)
    def start(self, tokens):
        r = self.admit(tokens)
        if r is not None:
            self.running.append(r)

    @precondition(lambda self: self.running)
    @rule(marks=st.lists(st.booleans(), min_size=1, max_size=4))
    def finish(self, marks):
        self.compute(self.running.pop(0), marks)

    @rule(tokens=tokens_st)
    def match(self, tokens):
        m = self.cache.match_prefix(tokens)
        assert (m.pages, m.num_tokens, m.state_slot, m.state_tokens) == self.predict(tokens)
        self.index.apply("w", self.cache.take_events())
        assert self.index.match(hash_blocks(tokens, P)).get("w", 0) * P == m.num_tokens

    @invariant()
    def index_agrees(self):
        """The index built from the events holds the cache's blocks and checkpoints."""
        self.index.apply("w", self.cache.take_events())
        assert self.index.blocks("w") == set(self.cache.all_block_hashes())
        nodes = self.cache._ckpt.slot
        assert (self.index._states.held("w") or set()) == {n.hashes[-1] for n in nodes}

    @rule(n=st.integers(0, 8))
    def evict(self, n):
        before = self.cache.evictable_tokens // P
        assert self.cache.evict(n) >= min(n, before)
        self.resync()
        self.held()

    @rule(n=st.integers(0, 4))
    def evict_states(self, n):
        before = self.cache.evictable_states()
        assert self.cache.evict_states(n) >= min(n, before)
        self.resync()
        self.held()

    @invariant()
    def integrity(self):
        slots = [r.slot for r in self.running if r.slot is not None]
        self.cache.check_integrity(held_pages=[], held_slots=slots)


TestMambaCacheMachine = MambaCacheMachine.TestCase
TestMambaCacheMachine.settings = CACHE_SETTINGS
