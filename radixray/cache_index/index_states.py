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

Tiers: a worker with a host tier (``mamba_host``) demotes a checkpoint with its node, or moves
it to the host alone when its state pool is short, and resumes from a host checkpoint by copying
it into the request's slot. So the marks are kept per tier: device marks from device-medium
mamba events (a block whose KV left the device loses its device mark), host marks from
host-medium ones (a host checkpoint outlives its block's host KV copy: it is lost only with the
block's KV on both tiers, or by its own removal). A worker resumes where a block, with every
block before it cached on some tier, has a mark on either tier: ``cut`` counts both (the copy
of one state is cheap next to recomputing or loading KV).
"""

from __future__ import annotations

from collections.abc import Container, Hashable, Sequence

from .events import BlockRemoved, BlockStored

__all__ = ["IndexStates"]

HOST_MEDIUM = "CPU"  # the ``medium`` of a host-tier event (approx_index's)

WorkerId = Hashable


class IndexStates:
    def __init__(self) -> None:
        self._held: dict[WorkerId, set[int]] = {}  # a state worker's checkpointed device blocks
        self._host: dict[WorkerId, set[int]] = {}  # ... and blocks with a host checkpoint

    def __bool__(self) -> bool:
        return bool(self._held)

    def held(self, worker: WorkerId, tier: str = "device") -> set[int] | None:
        """A state worker's blocks with a checkpoint in ``tier`` (None: not a state worker)."""
        return (self._held if tier == "device" else self._host).get(worker)

    def clear(self, worker: WorkerId) -> None:
        for held in (self._held.get(worker), self._host.get(worker)):
            if held is not None:
                held.clear()

    def forget(self, worker: WorkerId) -> None:
        self._held.pop(worker, None)
        self._host.pop(worker, None)

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

    def removed(
        self, worker: WorkerId, hashes: Sequence[int], tier: str, cached: Container[int] = ()
    ) -> None:
        """A full-group removal in ``tier`` (or the index trimmed the blocks there): device
        marks go with device KV; a host mark only with the last copy of the block's KV
        (``cached``: the blocks the worker still holds on either tier)."""
        held = self._held.get(worker)
        if held is None:
            return
        if tier == "device":
            held.difference_update(hashes)
        host = self._host[worker]
        if host:
            host.difference_update([h for h in hashes if h not in cached])

    def apply(
        self, worker: WorkerId, ev: BlockStored | BlockRemoved, lru: Container[int],
        host_lru: Container[int],
    ) -> None:  # fmt: skip
        """A mamba group's event (its tier from ``ev.medium``): the worker is a state worker
        from now on; the named blocks gain or lose their checkpoint there. A block the worker
        does not hold cannot gain one: on the device a block not in ``lru``, on the host one
        in neither ``lru`` nor ``host_lru`` (a host checkpoint may sit on device KV)."""
        host = ev.medium == HOST_MEDIUM
        held = (self._held.setdefault(worker, set()), self._host.setdefault(worker, set()))[host]
        if isinstance(ev, BlockRemoved):
            held.difference_update(ev.block_hashes)
        else:
            held.update(h for h in ev.block_hashes if h in lru or (host and h in host_lru))

    def cut(self, worker: WorkerId, hashes: Sequence[int], n: int) -> int:
        """``n`` leading blocks of ``worker`` cut back to its deepest checkpointed one (a
        checkpoint on either tier)."""
        held = self._held.get(worker)
        if held is None:
            return n
        host = self._host[worker]
        while n and hashes[n - 1] not in held and hashes[n - 1] not in host:
            n -= 1
        return n

    def cut_all(self, hashes: Sequence[int], result: dict[WorkerId, int]) -> dict:
        """Every worker's prefix in ``result`` cut (workers left with none dropped)."""
        if not self._held:
            return result
        cut = ((w, self.cut(w, hashes, n)) for w, n in result.items())
        return {w: c for w, c in cut if c}
