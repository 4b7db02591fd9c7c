"""MambaRadixCache: the radix cache of a model with recurrent-state layers (docs/models.md).

A sequence resumes only from the KV of its attention layers *and* every state layer's state
after exactly its cached tokens. So a node holds KV pages (``RadixCache``'s page ids) and,
optionally, a *state checkpoint*: a slot id of the state pool (its own allocator of ints) with
the state after the node's last token (``state_checkpoints.Checkpoints``). A match is usable
only up to the deepest node on its path that has one::

    root
     └── (a b)(c d) [slot 3]       a match of "abcdefgh.." stops at "abcd"
          └── (e f)(g h)           a tombstone: KV kept, no checkpoint
               └── (i j) [slot 5]  a match of "abcdefghij.." resumes at "abcdefghij"

Invariants (``check_integrity``): every state slot is free, private to one caller, or in
exactly one node; **no leaf is a tombstone**: KV past the last checkpoint of a path could never
be reused, so ``insert`` takes KV only up to a checkpoint (it raises when a new leaf would have
none), and a leaf that loses its checkpoint loses its KV with it (as do the tombstones above it
that it leaves as leaves). A node that a request's lock ends at keeps its checkpoint until
unlocked, so a lock never ends at a tombstone.

Eviction: KV on the usual leaf LRU (``evict``; a leaf's checkpoint goes with it), checkpoints
on their own LRU when the state pool is short (``evict_states``; ancestors before descendants
at equal times): an inner node's checkpoint leaves a tombstone, a leaf's takes the leaf.
Inserting through a tombstone with a checkpoint at its end gives it the checkpoint back.

KV events: the full-attention group as ``RadixCache``'s; and a ``mamba`` group (vLLM's kind,
group 1) naming the blocks whose end holds a checkpoint: a ``BlockStored`` of the node's last
block when it gets one, a ``BlockRemoved`` when it loses it and stays a tombstone (a node
removed from the full group is gone from both). A router's index cuts its matches there
(``index_states``).

No host tier: a demoted node's checkpoint would have to move to host memory with it
(not built; ``memory_pool`` refuses ``host_pages`` for these models).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from .cache_contract import MatchResult, check_free_and_held
from .events import MAMBA, BlockRemoved, BlockStored, KVEvent
from .ghost import GhostList
from .page_allocator import PageAllocator
from .radix_cache import RadixCache
from .radix_tree import TreeNode
from .state_checkpoints import Checkpoints, direct_locks

__all__ = ["MambaRadixCache", "STATE_GROUP"]

STATE_GROUP = 1  # the mamba group's group_idx in KV events


class MambaRadixCache(RadixCache):
    def __init__(
        self,
        page_size: int,
        allocator: PageAllocator,
        state_allocator: PageAllocator,
        eviction: str = "lru",
        enable_events: bool = False,
        ghost_capacity: int | None = None,
        medium: str | None = "GPU",
        host_allocator: PageAllocator | None = None,
    ):
        if host_allocator is not None:
            raise ValueError("mamba_radix has no host tier (a checkpoint cannot be demoted yet)")
        kw = {} if ghost_capacity is None else {"ghost_capacity": ghost_capacity}
        super().__init__(page_size, allocator, eviction, enable_events, medium=medium, **kw)
        self.state_allocator = state_allocator
        self._ckpt = Checkpoints()
        self.num_states_evicted = 0  # checkpoints dropped by evict_states
        # Blocks a request computed past its last checkpoint, which were never cached: a later
        # miss on them is the cause "state" (seen, not kept for want of a state), not "cold".
        self._unkept = GhostList(self._ghost.capacity)

    # -------------------------------------------------------------- match

    def match_prefix(self, token_ids: Sequence[int], extra_key: str | None = None) -> MatchResult:
        """The longest cached prefix cut back to its deepest checkpoint: ``state_slot`` holds
        the state after ``num_tokens`` tokens; ``state_tokens`` are the cached tokens past it."""
        m = super().match_prefix(token_ids, extra_key)
        node, n = m.node, m.num_tokens
        while node.parent is not None and self._ckpt.get(node) is None:
            n -= len(node.key)
            node = node.parent
        if node.parent is None:  # no checkpoint on the path: nothing usable
            return MatchResult([], 0, node, state_tokens=m.num_tokens)
        self._ckpt.touch(node, self._ckpt.tick())
        pages = m.pages[: n // self.page_size]
        slot = self._ckpt.get(node)
        return MatchResult(pages, n, node, state_slot=slot, state_tokens=m.num_tokens - n)

    def peek_prefix(
        self, token_ids: list[int], block_hashes: Sequence[int], extra_key: str | None = None
    ) -> int:
        """``RadixCache.peek_prefix`` cut to the deepest checkpoint within it, read-only."""
        P = self.page_size
        n = super().peek_prefix(token_ids, block_hashes, extra_key)
        node, pos, best = self._tree.roots().get(extra_key), 0, 0
        while node is not None and pos < n:
            node = node.children.get(tuple(token_ids[pos : pos + P]))
            if node is None:
                break
            pos += len(node.key)
            if pos <= n and self._ckpt.get(node) is not None:
                best = pos
        return best

    def note_unkept(self, block_hashes: Sequence[int]) -> None:
        """Remember blocks computed past a request's last checkpoint (not inserted)."""
        self._unkept.add(block_hashes)

    def was_unkept(self, block_hashes: Sequence[int]) -> int:
        """How many leading ``block_hashes`` were computed here and not kept (no checkpoint at
        or after them; bounded memory, as the ghost list)."""
        return self._unkept.leading_hits(block_hashes)

    def state_at(self, node: TreeNode) -> int | None:
        """The checkpoint slot at ``node``'s end, or None (a tombstone, or a root)."""
        return self._ckpt.get(node)

    # -------------------------------------------------------------- insert

    def insert(
        self,
        token_ids: Sequence[int],
        pages: Sequence[int],
        extra_key: str | None = None,
        block_hashes: Sequence[int] | None = None,
        states: Mapping[int, int] | None = None,
    ) -> int:
        """``RadixCache.insert`` with the caller's checkpoints: ``states`` maps a position (a
        page multiple, at most the full pages of ``token_ids``) to a slot holding the state
        after that many tokens. The cache takes every slot: a node ending there without a
        checkpoint adopts it (a tombstone revived), any other is a duplicate and is freed.
        KV is taken up to the last position of ``states`` only if ``token_ids`` goes further
        and the rest is not cached already (a new leaf must end at a checkpoint), it raises
        ValueError, changing nothing."""
        P = self.page_size
        states = dict(states or {})
        n = len(token_ids) // P * P
        bad = [p for p in states if p <= 0 or p % P or p > n]
        if bad:
            raise ValueError(f"checkpoint positions {bad} are not page ends within {n} tokens")
        tokens = list(token_ids[:n])
        last = max(states, default=0)
        if n > last and len(self._tree.match(tokens, extra_key)[0]) * P < n:
            raise ValueError(
                f"insert of {n} tokens with its last checkpoint at {last}: a new leaf would "
                "have no checkpoint (insert only up to the last checkpoint)"
            )
        cached = None
        now = self._ckpt.tick()
        for p in sorted(states) or [n]:
            c = super().insert(tokens[:p], pages[: p // P], extra_key, block_hashes)
            if cached is None and c < p:
                cached = c
            if p in states:
                self._give(self._tree.match(tokens[:p], extra_key)[1], states[p], p, now)
        return n if cached is None else cached

    def _give(self, node: TreeNode, slot: int, end: int, now: int) -> None:
        if self._ckpt.get(node) is None:
            self._ckpt.set(node, slot, end, now)
            if self.enable_events:
                self._events.append(self._state_event(node))
        else:  # the same state after the same tokens is there already
            self._ckpt.touch(node, now)
            self.state_allocator.free([slot])

    # -------------------------------------------------------------- locks

    def lock_state(self, node: TreeNode) -> None:
        """Keep ``node``'s checkpoint (and its path's KV: a lock too) from eviction until
        ``unlock_state``: its state is being copied into a request's slot."""
        self._ckpt.lock(node)
        self._tree.lock(node)

    def unlock_state(self, node: TreeNode) -> None:
        self._ckpt.unlock(node)
        self._tree.unlock(node)

    # -------------------------------------------------------------- eviction

    def evict(self, num_pages: int) -> int:
        """KV leaves on the leaf LRU, each with its checkpoint, and the tombstones above it
        that it leaves as unlocked leaves."""
        if num_pages <= 0:
            return 0
        freed: list[int] = []
        slots: list[int] = []
        while len(freed) < num_pages:
            node = self._tree.device_leaves.pop()
            if node is None:
                break
            freed += self._remove(node, slots)
        self._free(freed, slots)
        return len(freed)

    def evictable_states(self) -> int:
        """Checkpoints ``evict_states`` could drop now."""
        return sum(1 for n in self._ckpt.lru.members if not direct_locks(n))

    def evict_states(self, num_slots: int) -> int:
        """Free at least ``min(num_slots, evictable_states())`` state slots, least recently
        used checkpoint first, skipping those where a request's lock ends. An inner node
        becomes a tombstone; a leaf is removed with its KV (and any tombstones it leaves as
        leaves). Returns the slots freed."""
        slots: list[int] = []
        pages: list[int] = []
        held: list[TreeNode] = []
        lru = self._ckpt.lru
        while len(slots) < num_slots:
            node = lru.pop()
            if node is None:
                break
            if direct_locks(node):  # a running request resumes here: keep it (no tombstone)
                held.append(node)
                continue
            if node.children:
                slots.append(self._ckpt.drop(node))
                if self.enable_events:  # a tombstone: gone from the mamba group only
                    ev = BlockRemoved([node.hashes[-1]], self.medium, STATE_GROUP, MAMBA)
                    self._events.append(ev)
            else:
                pages += self._remove(node, slots)
        for node in held:
            lru.add(node)
        self.num_states_evicted += len(slots)
        self._free(pages, slots)
        return len(slots)

    def _remove(self, node: TreeNode, slots: list[int]) -> list[int]:
        """Remove the unlocked leaf ``node`` (its checkpoint slot to ``slots``), then each
        tombstone ancestor that this leaves an unlocked leaf; returns their pages."""
        pages: list[int] = []
        first = True
        while node.parent is not None and not node.children and not node.lock_ref:
            if self._ckpt.get(node) is not None:
                if not first:
                    break  # an ancestor with a checkpoint: a leaf now, not a tombstone
                slots.append(self._ckpt.drop(node))
            first = False
            pages += node.pages
            parent = node.parent
            self._forget(node)
            node = parent
        return pages

    def _state_event(self, node: TreeNode) -> BlockStored:
        """The mamba group's store of ``node``'s last block (its end holds a checkpoint)."""
        P = self.page_size
        parent = node.hashes[-2] if len(node.hashes) > 1 else node.parent.last_hash
        h, tokens = [node.hashes[-1]], node.key[-P:]
        return BlockStored(h, parent, list(tokens), P, self.medium, STATE_GROUP, MAMBA)

    def snapshot_events(self) -> list[KVEvent]:
        """``RadixCache``'s, then the mamba group's store of every checkpointed block."""
        return super().snapshot_events() + [self._state_event(n) for n in self._ckpt.slot]

    def _forget(self, node: TreeNode) -> None:
        self._tree.remove(node)
        self._ghost.add(node.hashes)
        if self.enable_events:
            self._events.append(BlockRemoved(list(node.hashes), self.medium))

    def _free(self, pages: list[int], slots: list[int]) -> None:
        if pages:
            self.allocator.free(pages)
        if slots:
            self.state_allocator.free(slots)

    # -------------------------------------------------------------- reset / invariants

    def reset(self) -> None:
        if self._ckpt.locked:
            raise RuntimeError(f"cannot reset while {self._ckpt.locked} checkpoints are locked")
        super().reset()
        self._free([], self._ckpt.clear())

    def cached_slots(self) -> list[int]:
        """State slots held by the tree's checkpoints."""
        return list(self._ckpt.slot.values())

    @property
    def num_states(self) -> int:
        return len(self._ckpt)

    def check_integrity(
        self, held_pages: Iterable[int] | None = None, held_slots: Iterable[int] | None = None
    ) -> None:
        """``RadixCache``'s checks, then the checkpoints': each on a node of the tree at the
        position it says, no leaf without one, their LRU and locks; with ``held_slots`` (slots
        private to callers), free + cached + held is every slot, each once."""
        super().check_integrity(held_pages)
        self._ckpt.check()
        seen = 0
        for root in self._tree.roots().values():
            stack = [(c, 0) for c in root.children.values()]
            while stack:
                node, start = stack.pop()
                end = start + len(node.key)
                if not node.children and self._ckpt.get(node) is None:
                    raise AssertionError(f"leaf {node!r} is a tombstone (no checkpoint)")
                if self._ckpt.get(node) is not None:
                    seen += 1
                    if self._ckpt.end[node] != end:
                        raise AssertionError(
                            f"checkpoint of {node!r} says {self._ckpt.end[node]} tokens, is {end}"
                        )
                stack += [(c, end) for c in node.children.values()]
        if seen != len(self._ckpt):
            raise AssertionError(f"{len(self._ckpt) - seen} checkpoints on nodes not in the tree")
        cached = self.cached_slots()
        check_free_and_held(self.state_allocator, cached, held_slots)

    def __repr__(self) -> str:
        return f"Mamba{super().__repr__()[:-1]}, states={len(self._ckpt)})"
