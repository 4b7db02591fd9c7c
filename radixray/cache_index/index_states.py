"""``IndexStates``: what the router's index knows of its workers' state checkpoints.

A worker whose KV events name a ``mamba`` group serves a model with recurrent-state layers
(docs/state_cache.md): it resumes a prefix only at a block whose end holds a state checkpoint,
and its KV past the last one is recomputed. This keeps, per such worker, the device blocks that
end at a checkpoint, and cuts the index's answers about that worker back to the deepest one
within the matched prefix; ``ApproxIndex`` calls it on every store, removal and query, as it
calls ``IndexWindows`` (a fleet without state workers pays one empty-dict check a query).

The router's own insert (a request it sent there) marks the request's last block: the worker
checkpoints at its prompt's last full page. A full-group store from events marks nothing (the
mamba-group stores that follow it name the checkpoints); a full-group removal removes both.
State caches have no host tier, so only device blocks count.
"""

from __future__ import annotations

from collections.abc import Container, Hashable, Sequence

from .events import BlockRemoved, BlockStored

__all__ = ["IndexStates"]

WorkerId = Hashable


class IndexStates:
    def __init__(self) -> None:
        self._held: dict[WorkerId, set[int]] = {}  # a state worker's checkpointed blocks

    def __bool__(self) -> bool:
        return bool(self._held)

    def held(self, worker: WorkerId) -> set[int] | None:
        """A state worker's checkpointed device blocks (None: not a state worker)."""
        return self._held.get(worker)

    def clear(self, worker: WorkerId) -> None:
        held = self._held.get(worker)
        if held is not None:
            held.clear()

    def forget(self, worker: WorkerId) -> None:
        self._held.pop(worker, None)

    def stored(self, worker: WorkerId, hashes: Sequence[int], tier: str, own: bool) -> None:
        """A full-group store in ``tier`` (``own`` False: its checkpoints come in the mamba
        group's stores) or the router's own insert (True: the last block, on the device)."""
        held = self._held.get(worker)
        if held is None or tier != "device":
            return
        if own:
            held.update(hashes[-1:])
        else:
            held.difference_update(hashes)

    def removed(self, worker: WorkerId, hashes: Sequence[int], tier: str) -> None:
        held = self._held.get(worker)
        if held is not None and tier == "device":
            held.difference_update(hashes)

    def apply(self, worker: WorkerId, ev: BlockStored | BlockRemoved, lru: Container[int]) -> None:
        """A mamba group's event (device tier): the worker is a state worker from now on; the
        named blocks gain or lose their checkpoint (a block not held, not in ``lru``, cannot
        gain one)."""
        held = self._held.setdefault(worker, set())
        if isinstance(ev, BlockRemoved):
            held.difference_update(ev.block_hashes)
        else:
            held.update(h for h in ev.block_hashes if h in lru)

    def cut(self, worker: WorkerId, hashes: Sequence[int], n: int) -> int:
        """``n`` leading blocks of ``worker`` cut back to its deepest checkpointed one."""
        held = self._held.get(worker)
        if held is None:
            return n
        while n and hashes[n - 1] not in held:
            n -= 1
        return n

    def cut_all(self, hashes: Sequence[int], result: dict[WorkerId, int]) -> dict:
        """Every worker's prefix in ``result`` cut (workers left with none dropped)."""
        if not self._held:
            return result
        cut = ((w, self.cut(w, hashes, n)) for w, n in result.items())
        return {w: c for w, c in cut if c}
