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
on their own LRU when the state pool is short (``evict_states``; spare ones first, see
``state_checkpoints``): an inner node's leaves a tombstone, a leaf's takes the leaf. Inserting
through a tombstone with a checkpoint at its end gives it the checkpoint back.

KV events: the full-attention group as ``RadixCache``'s; and a ``mamba`` group (vLLM's kind,
group 1) naming the blocks whose end holds a checkpoint: a ``BlockStored`` of the node's last
block when it gets one, a ``BlockRemoved`` when it loses it and stays a tombstone (a node
removed from the full group is gone from both). A router's index cuts its matches there
(``index_states``).

Host tier (``host_allocator`` and ``host_state_allocator``: host pages and host state slots):
a demoted node's checkpoint is demoted with it, to a host state slot, and a checkpoint the
state pool cannot keep moves there too (``mamba_host``). A match then runs over both tiers to
the deepest checkpoint in either; one on the host is copied from there into the request's slot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from .cache_contract import MatchResult, check_free_and_held
from .checkpoint_walk import walk_to_positions
from .events import MAMBA, BlockRemoved, KVEvent
from .ghost import GhostList
from .host_tier import HOST
from .mamba_host import STATE_GROUP, MambaHostTier, check_states, state_stored
from .page_allocator import PageAllocator
from .radix_cache import RadixCache
from .radix_tree import TreeNode
from .state_checkpoints import Checkpoints, direct_locks

__all__ = ["MambaRadixCache", "STATE_GROUP"]


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
        host_state_allocator: PageAllocator | None = None,
    ):
        kw = {} if ghost_capacity is None else {"ghost_capacity": ghost_capacity}
        self.state_allocator = state_allocator
        self._ckpt = Checkpoints()
        self._host_slots = host_state_allocator  # (read by _host_tier, which super() calls)
        self.host: MambaHostTier | None
        super().__init__(
            page_size, allocator, eviction, enable_events, medium=medium,
            host_allocator=host_allocator, **kw,
        )  # fmt: skip
        self.num_states_evicted = 0  # checkpoints dropped by evict_states
        # Blocks a request computed past its last checkpoint, which were never cached: a later
        # miss on them is the cause "state" (seen, not kept for want of a state), not "cold".
        self._unkept = GhostList(self._ghost.capacity)

    def _host_tier(self, host_allocator, emit) -> MambaHostTier:
        return MambaHostTier(host_allocator, self._tree, self._ghost, emit, self._host_slots,
                             self._ckpt, self.state_allocator)  # fmt: skip

    def _has_state(self, node: TreeNode) -> bool:
        return self._ckpt.get(node) is not None or (
            self.host is not None and self.host.ckpt.get(node) is not None
        )

    def _state_of(self, node: TreeNode) -> tuple[int, bool]:
        """``node``'s checkpoint slot, and whether it is a host slot (a device one first)."""
        slot = self._ckpt.get(node)
        if slot is not None:
            self._ckpt.resume(node, self._ckpt.tick())
            return slot, False
        self.host.ckpt.resume(node, self._ckpt.tick())  # (a spare one moved there: not now)
        return self.host.ckpt.get(node), True

    # -------------------------------------------------------------- match

    def match_prefix(self, token_ids: Sequence[int], extra_key: str | None = None) -> MatchResult:
        """The longest cached prefix cut back to its deepest checkpoint: ``state_slot`` holds
        the state after ``num_tokens`` tokens; ``state_tokens`` are the cached tokens past it.
        With a host tier, a checkpoint in the host-only continuation ends the match there:
        ``host_pages`` up to it, its host slot (``load_back`` brings the KV; if the caller
        cannot, ``device_part`` is the match without it)."""
        m = super().match_prefix(token_ids, extra_key)
        total = m.num_tokens + m.host_tokens
        node, n = m.host_node, total
        while node is not None and node is not m.node and self.host.ckpt.get(node) is None:
            n -= len(node.key)
            node = node.parent
        if node is None or node is m.node:
            return self._cut(m.node, m.num_tokens, m.pages, total)
        slot, _ = self._state_of(node)
        h = n - m.num_tokens
        host = m.host_pages[: h // self.page_size]
        return MatchResult(m.pages, m.num_tokens, m.node, host, h, node, state_slot=slot,
                           state_tokens=total - n, state_host=True)  # fmt: skip

    def _cut(self, node: TreeNode, n: int, pages: Sequence[int], total: int) -> MatchResult:
        """The device match ending at ``node`` (``n`` tokens) cut back to its deepest node with
        a checkpoint (on either tier); ``total`` tokens were cached."""
        while node.parent is not None and not self._has_state(node):
            n -= len(node.key)
            node = node.parent
        if node.parent is None:  # no checkpoint on the path: nothing usable
            return MatchResult([], 0, node, state_tokens=total)
        slot, host = self._state_of(node)
        return MatchResult(list(pages[: n // self.page_size]), n, node, state_slot=slot,
                           state_tokens=total - n, state_host=host)  # fmt: skip

    def device_part(self, m: MatchResult) -> MatchResult:
        """``m`` without its host continuation: its device prefix cut to a checkpoint (what a
        request starts from when the continuation cannot be loaded back)."""
        if m.host_node is None:
            return m
        total = m.num_tokens + m.host_tokens + m.state_tokens
        return self._cut(m.node, m.num_tokens, m.pages, total)

    def load_back(self, m: MatchResult, pages: Sequence[int]) -> MatchResult:
        """``RadixCache.load_back``; the match then names the checkpoint at its end (on the
        host: it stays there, and is copied into the request's slot)."""
        full = super().load_back(m, pages)
        slot, host = self._state_of(full.node)
        return full._replace(state_slot=slot, state_host=host)

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
            if pos <= n and self._has_state(node):
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
        dev, _, host, _ = self._tree.match_tiers(tokens, extra_key)
        if n > last and (len(dev) + len(host)) * P < n:
            raise ValueError(
                f"insert of {n} tokens with its last checkpoint at {last}: a new leaf would "
                "have no checkpoint (insert only up to the last checkpoint)"
            )
        now, mark = self._ckpt.tick(), len(self._events)
        if not states:  # only host-only nodes on the cached path can adopt pages
            return super().insert(tokens, pages, extra_key, block_hashes)
        c = super().insert(tokens[:last], pages[: last // P], extra_key, block_hashes)
        del self._events[mark:]  # re-emitted: a BlockStored per segment between checkpoints
        for p, node, seg in walk_to_positions(self._tree, tokens, extra_key, sorted(states), c):
            self._stored(seg)
            self._give(node, states[p], p, now)
        (self.host or self._ckpt).spare_above(node)  # above its deepest, either tier: spare
        return n if c >= last else c

    def _give(self, node: TreeNode, slot: int, end: int, now: int) -> None:
        if self._ckpt.get(node) is None:
            self._ckpt.set(node, slot, end, now)
            if self.enable_events:
                self._events.append(state_stored(node, self.page_size, self.medium))
        else:  # the same state after the same tokens is there already
            self._ckpt.touch(node, now)
            self.state_allocator.free([slot])

    # -------------------------------------------------------------- locks

    def lock_state(self, node: TreeNode, host: bool = False) -> None:
        """Keep ``node``'s checkpoint (``host``: its host one) and its path's KV (a lock too)
        from eviction until ``unlock_state``: its state is being copied into a request's slot."""
        (self.host.ckpt if host else self._ckpt).lock(node)
        self._tree.lock(node)

    def unlock_state(self, node: TreeNode, host: bool = False) -> None:
        (self.host.ckpt if host else self._ckpt).unlock(node)
        self._tree.unlock(node)

    # -------------------------------------------------------------- eviction

    def evict(self, num_pages: int) -> int:
        """KV leaves on the leaf LRU, each with its checkpoint, and the tombstones above it
        that it leaves as unlocked leaves. With a host tier a leaf is demoted, its checkpoint
        with it (``MambaHostTier.demote``), or, with no room there, forgotten."""
        if num_pages <= 0:
            return 0
        freed: list[int] = []
        slots: list[int] = []
        while len(freed) < num_pages:
            node = self._tree.device_leaves.pop()
            if node is None:
                break
            pages = self.host.demote(node) if self.host else None
            if pages is None:
                if self.host:
                    self.host.forget_below(node)
                pages = self._remove(node, slots)
            freed += pages
            freed += self._prune(slots)
        self._free(freed, slots)
        return len(freed)

    def make_host_room(self, num_pages: int) -> bool:
        """``HostTier.make_room`` (host LRU evictions), then the orphans it left pruned."""
        ok, slots = self.host.make_room(num_pages), []
        self._free(self._prune(slots), slots)
        return ok

    def _prune(self, slots: list[int]) -> list[int]:
        """Remove the host tier's orphans that are childless unlocked tombstones, and the
        tombstones that leaves as leaves; returns their device pages."""
        if self.host is None or not self.host.orphans:
            return []
        pages: list[int] = []
        orphans, self.host.orphans = self.host.orphans, []
        P = self.page_size
        for node in orphans:
            parent = node.parent
            if parent is not None and parent.children.get(tuple(node.key[:P])) is node:
                if not self._has_state(node) and not node.children and not node.lock_ref:
                    pages += self._remove(node, slots)
        return pages

    def evictable_states(self) -> int:
        """Checkpoints ``evict_states`` could drop now."""
        return sum(1 for n in self._ckpt.lru.members if not direct_locks(n))

    def evict_states(self, num_slots: int) -> int:
        """Free at least ``min(num_slots, evictable_states())`` state slots in ``Checkpoints``'
        order, but where a request's lock ends. With a host tier a checkpoint moves to a host
        slot (``MambaHostTier.keep``); else an inner node becomes a tombstone and a leaf goes
        with its KV (and the tombstones it leaves as leaves). Returns the slots freed."""
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
            if (self.host is not None and self.host.keep(node)) or node.children:
                slots.append(self._ckpt.drop(node))
                if self.enable_events:  # gone from the device's mamba group only
                    ev = BlockRemoved([node.hashes[-1]], self.medium, STATE_GROUP, MAMBA)
                    self._events.append(ev)
            else:
                pages += self._remove(node, slots)
        for node in held:
            lru.add(node)
        pages += self._prune(slots)
        self.num_states_evicted += len(slots)
        self._free(pages, slots)
        return len(slots)

    def _remove(self, node: TreeNode, slots: list[int]) -> list[int]:
        """Remove the unlocked leaf ``node`` (its checkpoint slot to ``slots``), then each
        tombstone ancestor that this leaves an unlocked leaf; returns their pages."""
        pages: list[int] = []
        first = True
        while node.parent is not None and not node.children and not node.lock_ref:
            if not first and self._has_state(node):
                break  # an ancestor with a checkpoint: a leaf now, not a tombstone
            first = False
            parent = node.parent
            pages += self._forget(node, slots)
            node = parent
        return pages

    def snapshot_events(self) -> list[KVEvent]:
        """``RadixCache``'s, then the mamba group's store of every checkpointed block (the
        host's on the host medium)."""
        events = super().snapshot_events()
        events += [state_stored(n, self.page_size, self.medium) for n in self._ckpt.slot]
        if self.host is not None:
            events += [state_stored(n, self.page_size, HOST) for n in self.host.ckpt.slot]
        return events

    def _forget(self, node: TreeNode, slots: list[int]) -> list[int]:
        """Take the childless ``node`` out of the tree with its checkpoints (its device slot
        to ``slots``) and host pages; returns its device pages (the caller frees them)."""
        if self._ckpt.get(node) is not None:
            slots.append(self._ckpt.drop(node))
        host = self.host
        if host is not None and host.ckpt.get(node) is not None:
            host.slots.free([host.ckpt.drop(node)])
        self._tree.remove(node)
        self._ghost.add(node.hashes)
        if self.enable_events and node.pages:
            self._events.append(BlockRemoved(list(node.hashes), self.medium))
        if node.host:
            host.allocator.free(node.host)
            host.evicted_pages += len(node.host)
            if self.enable_events:
                self._events.append(BlockRemoved(list(node.hashes), HOST))
        return node.pages

    def _free(self, pages: list[int], slots: list[int]) -> None:
        if pages:
            self.allocator.free(pages)
        if slots:
            self.state_allocator.free(slots)

    # -------------------------------------------------------------- reset / invariants

    def reset(self) -> None:
        locked = self._ckpt.locked + (self.host.ckpt.locked if self.host else 0)
        if locked:
            raise RuntimeError(f"cannot reset while {locked} checkpoints are locked")
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
        """``RadixCache``'s checks (device and host pages), then the checkpoints' on both tiers
        (``check_states``); with ``held_slots`` (device slots private to callers), free +
        cached + held is every device slot, each once, and every host slot is free or cached."""
        super().check_integrity(held_pages)
        check_states(self._tree, self._ckpt, self.host.ckpt if self.host else None)
        check_free_and_held(self.state_allocator, self.cached_slots(), held_slots)
        if self.host is not None:
            check_free_and_held(self.host.slots, list(self.host.ckpt.slot.values()), ())

    def __repr__(self) -> str:
        return f"Mamba{super().__repr__()[:-1]}, states={len(self._ckpt)})"
