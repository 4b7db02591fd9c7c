"""The router's approximate view of every worker's KV cache.

One dict maps a block hash to a bitmask of the workers believed to hold it, so ``match`` walks the
query's hashes once for all workers::

    hashes   h0     h1     h2     h3
    owners   0b111  0b101  0b001  (none)
    result   worker0: 3, worker2: 2 (bit 2 drops at h2), worker1: 1 (bit 1 drops at h1)

Block hashes are chained (``block_hash``), so holding ``h[i]`` means holding the whole prefix
through page ``i``; matching stops at the first hash a worker lacks.

Two tiers per worker, kept apart: the device pool (events with ``medium`` "GPU", or none) and
the host tier behind it (``medium`` "CPU": pages demoted to host memory, which a worker loads back
instead of recomputing). ``match`` sees the device tier only (what a tier-blind router sees);
``match_tiers`` gives each worker's device prefix and its prefix over both tiers, so a policy can
price the difference as a load. A device removal never drops a host copy, and the reverse.

Sliding windows (docs/window_cache.md): a worker whose KV events name a ``sliding_window``
group keeps its window layers' pages apart and can drop them while the full pages stay. The
index then also holds which of its blocks have their window pages, per tier, and every answer
about that worker is cut to the *reusable* prefix: full blocks present and, before the match
point, a whole window of window blocks (``window_pages.reusable_pages``; over both tiers a
host-only block counts its host window page). A full-group removal removes both groups; a
full-group store resets the blocks' window pages (the window-group stores that follow name
them). The router's own inserts count in the window group for the request's last window only.
That bookkeeping is ``IndexWindows`` (index_windows.py). Likewise a worker whose events name
a ``mamba`` group (recurrent-state layers, docs/state_cache.md) resumes only at a block whose
end holds a state checkpoint, so its answers are cut back to the deepest one
(``IndexStates``, index_states.py).

"Approximate" means stale or trimmed, never fuzzy. Entries come from the router's own decisions
(immediate, optimistic) and from workers' KV events (late, authoritative); each worker's entries
are bounded by an LRU of ``max_blocks_per_worker``. Below that bound a lookup is exact for the
view the index was given. ``lost`` (LostBlocks) counts, from the events, blocks a worker removes
for good and those computed again."""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence

from .block_hash import check_page_size
from .events import (
    MAMBA,
    SLIDING_WINDOW,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVEvent,
)
from .index_states import IndexStates
from .index_windows import IndexWindows
from .lost_blocks import LostBlocks

__all__ = ["ApproxIndex", "HOST_MEDIUM", "TIERS"]

WorkerId = Hashable
_MISSING = object()
HOST_MEDIUM = "CPU"  # the ``medium`` of a host-tier event; anything else is the device pool
TIERS = ("device", "host")


class ApproxIndex:
    def __init__(
        self,
        page_size: int,
        max_blocks_per_worker: int = 1 << 20,
        windows: bool = True,
        states: bool = True,
    ):
        """``windows=False``: window-blind, as a router that indexes only the full-attention
        group (Dynamo's today): sliding-window events are ignored, so a windowed worker's
        prefix counts wherever its full-attention blocks are, window pages or not.
        ``states=False``: checkpoint-blind, likewise for mamba groups (a simulator option)."""
        self.page_size = check_page_size(page_size)
        self.windows, self.states = windows, states
        if max_blocks_per_worker < 1:
            raise ValueError(f"max_blocks_per_worker must be >= 1, got {max_blocks_per_worker}")
        self.max_blocks_per_worker = max_blocks_per_worker
        self._owners: dict[int, int] = {}  # block hash -> bitmask of worker slots
        self._lru: dict[WorkerId, OrderedDict[int, None]] = {}  # per worker, oldest first
        # The host tier, the same two structures: entries only a tiered worker's events make.
        self._host_owners: dict[int, int] = {}
        self._host_lru: dict[WorkerId, OrderedDict[int, None]] = {}
        self._slot: dict[WorkerId, int] = {}
        self._slot_worker: list[WorkerId | None] = []
        self._all_mask = 0
        self.trimmed_blocks = 0  # entries dropped by the LRU bound (for metrics)
        self.lost = LostBlocks()  # blocks workers evicted, and how often they are asked again
        self._windows = IndexWindows(self.page_size)  # workers with a sliding-window group
        self._states = IndexStates()  # workers with a mamba group

    # ------------------------------------------------------------------ workers

    def add_worker(self, worker: WorkerId) -> None:
        if worker in self._slot:
            return
        try:
            slot = self._slot_worker.index(None)
            self._slot_worker[slot] = worker
        except ValueError:
            slot = len(self._slot_worker)
            self._slot_worker.append(worker)
        self._slot[worker] = slot
        self._lru[worker] = OrderedDict()
        self._host_lru[worker] = OrderedDict()
        self._all_mask |= 1 << slot

    def remove_worker(self, worker: WorkerId) -> None:
        """Forget a worker entirely (it died or was removed)."""
        if worker not in self._slot:
            return
        self.clear(worker)
        slot = self._slot.pop(worker)
        del self._lru[worker]
        del self._host_lru[worker]
        self._slot_worker[slot] = None
        self._all_mask &= ~(1 << slot)
        self._windows.forget(worker)
        self._states.forget(worker)

    def workers(self) -> list[WorkerId]:
        return list(self._slot)

    def num_blocks(self, worker: WorkerId | None = None, tier: str = "device") -> int:
        """Entries held for ``worker`` (or for all workers together) in ``tier``."""
        lrus = self._tier(tier)[1]
        if worker is None:
            return sum(len(lru) for lru in lrus.values())
        lru = lrus.get(worker)
        return len(lru) if lru is not None else 0

    def _tier(self, tier: str) -> tuple[dict[int, int], dict[WorkerId, OrderedDict]]:
        if tier == "device":
            return self._owners, self._lru
        if tier == "host":
            return self._host_owners, self._host_lru
        raise ValueError(f"tier must be one of {TIERS}, got {tier!r}")

    def num_distinct_blocks(self) -> int:
        return len(self._owners)

    # ------------------------------------------------------------------ updates

    def insert(
        self, worker: WorkerId, hashes: Sequence[int], tier: str = "device", window: bool = True
    ) -> None:
        """Record that ``worker`` holds these blocks in ``tier`` (and refresh them in its LRU).
        On a windowed worker's device tier, ``window`` True (the router's own insert of a request
        it sent there: it computes the last window's blocks, and drops the earlier ones) gives
        the last window's blocks their window pages; False (a full-group store: blocks new in
        its tree) none, the window-group stores that follow it name those that have one."""
        if worker not in self._slot:
            self.add_worker(worker)
        self._windows.stored(worker, hashes, tier, window)
        self._states.stored(worker, hashes, tier, window)
        held = self._windows.held(worker, tier)
        bit = 1 << self._slot[worker]
        owners, lrus = self._tier(tier)
        lru = lrus[worker]
        # Deepest block first, so it ends up oldest: the LRU bound trims chains from their tail,
        # never leaving a suffix whose prefix was dropped (it could never match).
        for h in reversed(hashes):
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                owners[h] = owners.get(h, 0) | bit
        excess = len(lru) - self.max_blocks_per_worker
        if excess > 0:
            self.trimmed_blocks += excess
            trimmed = [lru.popitem(last=False)[0] for _ in range(excess)]
            for h in trimmed:
                _clear_bit(owners, h, bit)
                if held is not None:
                    held.discard(h)
            other = self._tier("host" if tier == "device" else "device")[1][worker]
            self._states.removed(worker, trimmed, tier, other)  # (their checkpoint marks too)

    def remove(self, worker: WorkerId, hashes: Iterable[int], tier: str = "device") -> None:
        """Record that ``worker`` no longer holds these blocks in ``tier``."""
        owners, lrus = self._tier(tier)
        lru = lrus.get(worker)
        if lru is None:
            return
        bit = 1 << self._slot[worker]
        held = self._windows.held(worker, tier)
        other = self._tier("host" if tier == "device" else "device")[1][worker]
        gone = []
        for h in hashes:
            if lru.pop(h, _MISSING) is not _MISSING:
                _clear_bit(owners, h, bit)
            if h not in other:  # not demoted, not loaded back: lost (trimmed from here or not)
                gone.append(h)
            if held is not None:
                held.discard(h)
        self.lost.lost(gone)
        self._states.removed(worker, hashes, tier, other)

    def clear(self, worker: WorkerId) -> None:
        """Drop every entry of ``worker``, both tiers (it stays registered)."""
        if worker not in self._slot:
            return
        bit = 1 << self._slot[worker]
        self._windows.clear(worker)
        self._states.clear(worker)
        for tier in TIERS:
            owners, lrus = self._tier(tier)
            lru = lrus[worker]
            for h in lru:
                _clear_bit(owners, h, bit)
            lru.clear()

    def apply(self, worker: WorkerId, events: Iterable[KVEvent] | EventBatch) -> None:
        """Apply a worker's KV events in order."""
        if isinstance(events, EventBatch):
            events = events.events
        for ev in events:
            if isinstance(ev, (BlockStored, BlockRemoved)) and ev.kind == SLIDING_WINDOW:
                if self.windows:
                    self._apply_window(worker, ev)
            elif isinstance(ev, (BlockStored, BlockRemoved)) and ev.kind == MAMBA:
                if self.states:
                    self.add_worker(worker)
                    self._states.apply(worker, ev, self._lru[worker], self._host_lru[worker])
            elif isinstance(ev, BlockStored):
                tier = _tier_of(ev.medium)
                if tier == "device":  # a lost block computed again? (before it counts as held)
                    slot = self._slot.get(worker)
                    self.lost.stored(ev.block_hashes, self._owners, self._host_owners, slot)
                self.insert(worker, ev.block_hashes, tier, window=False)
            elif isinstance(ev, BlockRemoved):
                self.remove(worker, ev.block_hashes, _tier_of(ev.medium))
            elif isinstance(ev, AllBlocksCleared):
                self.clear(worker)
            else:
                raise TypeError(f"not a KV event: {ev!r}")

    def _apply_window(self, worker: WorkerId, ev: BlockStored | BlockRemoved) -> None:
        """A sliding-window group's event (``IndexWindows.apply``)."""
        if worker not in self._slot:
            self.add_worker(worker)
        tier = _tier_of(ev.medium)
        self._windows.apply(worker, ev, tier, self._tier(tier)[1][worker])

    def window_blocks(self, worker: WorkerId, tier: str = "device") -> set[int]:
        """The blocks of ``worker`` in ``tier`` that have their window pages."""
        return set(self._windows.held(worker, tier) or ())

    def window_of(self, worker: WorkerId) -> int | None:
        """The worker's sliding window, once its events named one (None: not windowed)."""
        return self._windows.window.get(worker)

    # ------------------------------------------------------------------ queries

    def match(self, hashes: Sequence[int]) -> dict[WorkerId, int]:
        """Reusable leading blocks per worker, in one walk; workers with 0 are omitted."""
        return self._states.cut_all(hashes, self._windows.cut_all(hashes, self._match(hashes)))

    def _match(self, hashes: Sequence[int]) -> dict[WorkerId, int]:
        owners = self._owners
        mask = self._all_mask
        result: dict[WorkerId, int] = {}
        i = 0
        for h in hashes:
            m = owners.get(h, 0) & mask
            if m != mask:
                if i:
                    self._credit(mask & ~m, i, result)
                mask = m
                if not mask:
                    return result
            i += 1
        if i:
            self._credit(mask, i, result)
        return result

    def match_tiers(self, hashes: Sequence[int]) -> dict[WorkerId, tuple[int, int]]:
        """Per worker holding a prefix in either tier: ``(device, reusable)`` leading blocks,
        ``device`` on its device pool (``match``'s count) and ``reusable`` on its device pool or
        its host tier, block by block (``reusable - device`` blocks would be loaded back)."""
        windows, states = self._windows, self._states
        if not self._host_owners:
            device = states.cut_all(hashes, windows.cut_all(hashes, self._match(hashes)))
            return {w: (n, n) for w, n in device.items()}
        raw, both = self._match_both(hashes)
        device = states.cut_all(hashes, windows.cut_all(hashes, raw))
        for w in windows.window.keys() & both.keys():
            both[w] = windows.cut_tiers(w, hashes, raw.get(w, 0), both[w])
        both = states.cut_all(hashes, both)  # (a state worker's: at a checkpoint on either tier)
        return {w: (device.get(w, 0), n) for w, n in both.items() if n}

    def _match_both(self, hashes: Sequence[int]) -> tuple[dict, dict]:
        """``_match``'s answer and the same over both tiers (a block on either counts), in one
        walk: the workers still matching on their device are among those matching on both."""
        owners, host = self._owners, self._host_owners
        device = mask = self._all_mask
        raw: dict[WorkerId, int] = {}
        both: dict[WorkerId, int] = {}
        i = 0
        for h in hashes:
            on_device = owners.get(h, 0)
            m = on_device & device
            if m != device:
                if i:
                    self._credit(device & ~m, i, raw)
                device = m
            m = (on_device | host.get(h, 0)) & mask
            if m != mask:
                if i:
                    self._credit(mask & ~m, i, both)
                mask = m
                if not mask:
                    return raw, both
            i += 1
        if i:
            self._credit(device, i, raw)
            self._credit(mask, i, both)
        return raw, both

    def longest_match(self, hashes: Sequence[int]) -> int:
        """The most leading blocks any one worker holds (``max(match(hashes).values())``,
        without building the per-worker answer unless a worker is windowed)."""
        if self._windows.window or self._states:
            return max(self.match(hashes).values(), default=0)
        owners = self._owners
        mask = self._all_mask
        i = 0
        for h in hashes:
            mask &= owners.get(h, 0)
            if not mask:
                break
            i += 1
        return i

    def prefix_on(self, worker: WorkerId, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` that ``worker`` holds (its entry in ``match``)."""
        lru = self._lru.get(worker)
        if lru is None:
            return 0
        i = 0
        for h in hashes:
            if h not in lru:
                break
            i += 1
        return self._states.cut(worker, hashes, self._windows.cut(worker, hashes, i))

    def _credit(self, bits: int, n: int, result: dict) -> None:
        slot_worker = self._slot_worker
        while bits:
            low = bits & -bits
            result[slot_worker[low.bit_length() - 1]] = n
            bits ^= low

    def holds(self, worker: WorkerId, h: int, tier: str = "device") -> bool:
        lru = self._tier(tier)[1].get(worker)
        return lru is not None and h in lru

    def blocks(self, worker: WorkerId, tier: str = "device") -> set[int]:
        lru = self._tier(tier)[1].get(worker)
        return set(lru) if lru is not None else set()

    def memory_bytes(self) -> int:
        """Estimated bytes held: the containers plus the int objects they keep alive."""
        int_size = sys.getsizeof(1 << 63)  # a 64-bit hash as a Python int
        total = 0
        for tier in TIERS:
            owners, lrus = self._tier(tier)
            total += sys.getsizeof(owners) + len(owners) * 2 * int_size
            for lru in lrus.values():
                total += sys.getsizeof(lru) + len(lru) * int_size
        return total + self.lost.memory_bytes()

    def stats(self) -> dict:
        return {
            "workers": len(self._slot),
            "entries": self.num_blocks(),
            "host_entries": self.num_blocks(tier="host"),
            "distinct_blocks": len(self._owners),
            "memory_bytes": self.memory_bytes(),
            "trimmed_blocks": self.trimmed_blocks,
            **self.lost.stats(),
        }


def _tier_of(medium: str | None) -> str:
    return "host" if medium == HOST_MEDIUM else "device"


def _clear_bit(owners: dict[int, int], h: int, bit: int) -> None:
    rest = owners.get(h, 0) & ~bit
    if rest:
        owners[h] = rest
    else:
        owners.pop(h, None)
