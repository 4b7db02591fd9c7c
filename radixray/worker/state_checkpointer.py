"""``StateCheckpointer``: when a running request's state is saved to a checkpoint or restored
from one, for a prefix cache that keeps state checkpoints (``cache_index.MambaRadixCache``).
Slot ids and positions only; the model runner does the copies (``StateCopy``), checked against
its ledger of what each slot holds.

Where checkpoints are taken: at the page ends ``p`` that are multiples of ``state_interval``, and
at the end of the prompt's last full page (what the next turn of a chat, which extends this
prompt and its answer, matches at least). A prefill chunk is cut at those points (``chunk``), so
a step *starts* at one; the state in the request's slot when that step begins is exactly the
state after ``p`` tokens, so the save is a copy run just before that step's forward (``take``,
in the step's order on the device: the forward of the step before wrote it, the one after
reads it). The same holds for a decode step that starts at one. A request's checkpoints are its
own (``Request.checkpoints``: position -> slot) until it hands its KV to the cache (``insert``
at a chunk's commit or at its release), which takes them with the pages up to the last one.

Restores: a request admitted on a match that names a checkpoint gets that state copied into its
own slot (never shared in place: it writes its slot from its next token on) before its first
forward. The checkpoint is locked from admission until the copy is queued with the step, after
which any reuse of the slot comes later in the device's order. With a host tier the match may
name a checkpoint in a host slot (``state_host``): the restore copies it from there.

Checkpoints are optional: when the state pool is short even after evicting unlocked ones, a
point is skipped (the KV after the last checkpoint is then not cached).
"""

from __future__ import annotations

from typing import NamedTuple

from radixray.cache_index import PageAllocator, hash_blocks

from .request import Request

__all__ = ["StateCheckpointer", "StateCopy"]


class StateCopy(NamedTuple):
    """Copy slot ``src``'s state into slot ``dst`` before the step's forward: ``req``'s state
    after ``tokens`` tokens, saved to a checkpoint (``save``) or restored from one."""

    src: int
    dst: int
    req: Request
    tokens: int
    save: bool
    host: bool = False  # a restore from a host slot (a checkpoint on the host tier)


class StateCheckpointer:
    def __init__(self, cache, slots: PageAllocator, interval: int):
        if not isinstance(interval, int) or interval < 1:
            raise ValueError(f"state_interval must be an int >= 1, got {interval!r}")
        self.cache = cache
        self.slots = slots
        self.P = cache.page_size
        # checkpoint points are page ends that are multiples of the interval: of this
        self.step = interval * self.P // _gcd(interval, self.P)
        self._copies: list[StateCopy] = []
        self._locked: list = []  # checkpoints matched this step, unlocked once queued
        self.num_saved = 0
        self.num_restored = 0
        self.num_restored_host = 0  # of those, from a host slot
        self.num_skipped = 0  # points with no slot to spare

    def next_point(self, req: Request, start: int) -> int:
        """The first checkpoint point after ``start``."""
        nxt = (start // self.step + 1) * self.step
        last_page = req.num_prompt // self.P * self.P
        return min(nxt, last_page) if last_page > start else nxt

    def chunk(self, req: Request, limit: int) -> int:
        """Tokens of ``req``'s next chunk from ``num_computed``: at most ``limit`` and what is
        left, and never past a checkpoint point (the next step starts there)."""
        start = req.num_computed
        n = min(req.num_tokens - start, limit)
        return min(n, self.next_point(req, start) - start) if n > 1 else n

    def is_point(self, req: Request, pos: int) -> bool:
        return pos > 0 and (pos % self.step == 0 or pos == req.num_prompt // self.P * self.P)

    def free_slot(self) -> bool:
        """A slot is free now, after evicting a checkpoint if need be."""
        return self.slots.num_free > 0 or self.cache.evict_states(1) > 0

    def restore(self, req: Request, m) -> None:
        """``req`` was admitted on ``m`` (holding a slot now): its slot gets ``m``'s checkpoint
        before its first forward; the checkpoint stays locked until then."""
        if m.state_slot is None:
            return
        host = m.state_host
        self.cache.lock_state(m.node, host=host)
        self._locked.append((m.node, host))
        self._copies.append(StateCopy(m.state_slot, req.state_slot, req, m.num_tokens, False, host))
        self.num_restored += 1
        self.num_restored_host += host

    def take(self, items) -> list[StateCopy]:
        """The step's copies, in order: the restores of the requests admitted for it, then a
        save for each item that starts at a checkpoint point not yet cached or saved."""
        for it in items:
            req, start = it.req, it.start
            if (
                not self.is_point(req, start)
                or start <= req.num_tree_pages * self.P
                or start in req.checkpoints
            ):
                continue
            if not self.free_slot():
                self.num_skipped += 1
                continue
            slot = self.slots.alloc(1)[0]
            req.checkpoints[start] = slot
            self._copies.append(StateCopy(req.state_slot, slot, req, start, True))
            self.num_saved += 1
        for node, host in self._locked:  # queued: the copy runs before any later use of the slot
            self.cache.unlock_state(node, host=host)
        copies, self._copies, self._locked = self._copies, [], []
        return copies

    def insertable(self, req: Request, upto: int) -> tuple[int, dict[int, int]]:
        """Where ``req``'s KV may go into the cache, for KV computed up to ``upto``: its last
        checkpoint at or before ``upto`` (or what it already has in the tree), and the
        checkpoints to hand over with it (taken off the request)."""
        end = max((p for p in req.checkpoints if p <= upto), default=0)
        end = max(end, req.num_tree_pages * self.P)
        states = {p: s for p, s in req.checkpoints.items() if p <= end}
        for p in states:
            del req.checkpoints[p]
        return end, states

    def unkept(self, req: Request, end: int) -> None:
        """Tell the cache which of ``req``'s computed full pages past ``end`` (its last
        checkpoint) it does not get, so a later miss on them reads ``state``, not ``cold``."""
        P, known = self.P, req.block_hashes
        n = req.num_computed // P
        if n * P <= end:
            return
        hashes = list(known[:n])
        if len(known) < n:  # pages of its output: hashed on from the prompt's last page
            parent = known[-1] if known else None
            tokens = req.all_ids[len(known) * P : n * P]
            hashes += hash_blocks(tokens, P, parent=parent, extra_key=req.extra_key)
        self.cache.note_unkept(hashes[end // P :])

    def drop(self, req: Request) -> None:
        """Free the checkpoints ``req`` still holds (none it could hand to the cache)."""
        if req.checkpoints:
            self.slots.free(list(req.checkpoints.values()))
            req.checkpoints.clear()


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a
