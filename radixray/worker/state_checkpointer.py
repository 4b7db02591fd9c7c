"""``StateCheckpointer``: when a running request's state is saved to a checkpoint or restored
from one, for a prefix cache that keeps state checkpoints (``cache_index.MambaRadixCache``).
Slot ids and positions only; the model runner does the copies (``StateCopy``), checked against
its ledger of what each slot holds.

Where checkpoints are taken: at the page ends ``p`` that are multiples of ``state_interval``, and
at the end of the prompt's last full page (what the next turn of a chat, which extends this
prompt and its answer, matches at least). A prefill chunk is not cut at those points (it is
limited by the token budget only); ``take`` allocates each point's slot when the step is
planned, and the state is saved two ways::

    points       256      512      768      1024          (interval 256, a budget of 600)
    steps    |0 .............. 600|600 ........... 1024|1024 ...
    saves     256, 512 in its forward   768 in its forward   1024: a copy before its forward

- a point strictly inside a prefill chunk (``start < p < end``) is saved *inside* the forward
  (``StateCopy(inside=True)``): the state layers write their state after ``p`` tokens into the
  slot as they run the chunk (model/state_metadata.py, ``SeqSpan.saves``), the scan split at
  ``p``, which is bitwise what a chunk cut at ``p`` computed;
- a point where a step starts (a chunk the budget ended there, a decode step) is in the
  request's slot already: the save is a slot-to-slot copy run just before that step's forward,
  in the step's order on the device (the forward of the step before wrote it, the one after
  reads it). A point where a chunk ends is saved by the next step, as it starts there.

A request's checkpoints are its own (``Request.checkpoints``: position -> slot) until it hands
its KV to the cache (``insert`` at a chunk's commit or at its release), which takes them with the
pages up to the last one: a chunk's commit comes after its forward, so an in-forward save is in
its slot (in the device's order) before the cache can hand it to anyone.

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
    after ``tokens`` tokens, saved to a checkpoint (``save``) or restored from one. With
    ``inside`` the step's forward writes it instead, at that point of ``req``'s chunk (``src``
    is ``req``'s slot, which holds the state after the chunk's end once the step has run)."""

    src: int
    dst: int
    req: Request
    tokens: int
    save: bool
    host: bool = False  # a restore from a host slot (a checkpoint on the host tier)
    # a save written by the step's forward, inside ``req``'s chunk (not a copy before it)
    inside: bool = False


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
        self.num_saved_inside = 0  # of those, written by a forward inside a chunk
        self.num_restored = 0
        self.num_restored_host = 0  # of those, from a host slot
        self.num_skipped = 0  # points with no slot to spare

    def points(self, req: Request, start: int, end: int) -> list[int]:
        """The checkpoint points ``p`` with ``start < p < end``, increasing."""
        step = self.step
        out = list(range((start // step + 1) * step, end, step))
        last_page = req.num_prompt // self.P * self.P
        if start < last_page < end and last_page % step:
            out.append(last_page)
            out.sort()
        return out

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
        """The step's copies, in order: the restores of the requests admitted for it, then for
        each item a save (a copy) if it starts at a checkpoint point and one for each point
        inside its chunk (``inside``: its forward writes them), each point not yet cached or
        saved and given a slot if one can be had. Slots go round the items deepest point
        first (every item's deepest, then every item's next): when they run short the shallow
        points are skipped and no item goes without its deepest, as when chunks were cut at
        every point (one save a step, evicting the request's older ones)."""
        wanted = []
        for it in items:
            start = it.start
            points = self.points(it.req, start, start + it.num_tokens) if it.num_tokens > 1 else []
            if self.is_point(it.req, start):
                points.insert(0, start)
            wanted.append((it, points[::-1]))
        saves: list[list[StateCopy]] = [[] for _ in items]
        for depth in range(max((len(p) for _, p in wanted), default=0)):
            for (it, points), got in zip(wanted, saves, strict=True):
                if depth < len(points):
                    p = points[depth]
                    if (c := self._save(it.req, p, p > it.start)) is not None:
                        got.append(c)
        for got in saves:
            self._copies += got[::-1]
        for node, host in self._locked:  # queued: the copy runs before any later use of the slot
            self.cache.unlock_state(node, host=host)
        copies, self._copies, self._locked = self._copies, [], []
        return copies

    def _save(self, req: Request, pos: int, inside: bool) -> StateCopy | None:
        """A checkpoint of ``req`` at ``pos``, unless the tree or the request has one there, or
        no slot is free even after evicting checkpoints (the point is skipped)."""
        if pos <= req.num_tree_pages * self.P or pos in req.checkpoints:
            return None
        if not self.free_slot():
            self.num_skipped += 1
            return None
        slot = self.slots.alloc(1)[0]
        req.checkpoints[pos] = slot
        self.num_saved += 1
        self.num_saved_inside += inside
        return StateCopy(req.state_slot, slot, req, pos, True, inside=inside)

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
