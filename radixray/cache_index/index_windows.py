"""``IndexWindows``: what the router's index knows of its windowed workers' window pages.

A worker whose KV events name a ``sliding_window`` group (docs/window_cache.md) keeps its window
layers' pages apart from its full-attention pages and can drop them while the full pages stay. A
block of such a worker is reusable only with, before the match point, a whole window of blocks
that have their window pages (``window_pages.reusable_pages``). This keeps, per windowed worker,
its window and the blocks that have their window pages on each tier, and cuts the index's
answers about that worker to its reusable prefix; ``ApproxIndex`` calls it on every store,
removal and query (a fleet without windowed workers pays one empty-dict check a query).
"""

from __future__ import annotations

from collections.abc import Container, Hashable, Sequence

from .events import BlockRemoved, BlockStored
from .window_pages import reusable_pages

__all__ = ["IndexWindows"]

WorkerId = Hashable


class IndexWindows:
    def __init__(self, page_size: int):
        self.page_size = page_size
        self.window: dict[WorkerId, int] = {}  # a windowed worker's sliding window, in tokens
        # its blocks that have their window pages, on the device and on the host tier
        self._device: dict[WorkerId, set[int]] = {}
        self._host: dict[WorkerId, set[int]] = {}

    def held(self, worker: WorkerId, tier: str) -> set[int] | None:
        """A windowed worker's blocks in ``tier`` with window pages (None: not windowed)."""
        return (self._device if tier == "device" else self._host).get(worker)

    def clear(self, worker: WorkerId) -> None:
        """None of ``worker``'s blocks has its window pages any more (it stays windowed)."""
        for held in (self._device.get(worker), self._host.get(worker)):
            if held is not None:
                held.clear()

    def forget(self, worker: WorkerId) -> None:
        self.window.pop(worker, None)
        self._device.pop(worker, None)
        self._host.pop(worker, None)

    def stored(self, worker: WorkerId, hashes: Sequence[int], tier: str, window: bool) -> None:
        """A full-group store in ``tier`` (``window`` False: the blocks have no window pages
        until the window-group stores name them) or the router's own insert (True: the request's
        last window of blocks computed there, on the device)."""
        held = self.held(worker, tier)
        if held is None:
            return
        if not window:
            held.difference_update(hashes)
        elif tier == "device":
            P = self.page_size
            held.update(hashes[max(0, len(hashes) * P - self.window[worker] + 1) // P :])

    def apply(
        self, worker: WorkerId, ev: BlockStored | BlockRemoved, tier: str, lru: Container[int]
    ) -> None:
        """A sliding-window group's event: the worker is windowed from now on; its blocks in
        ``tier`` gain or lose their window pages (a block the full group does not hold there,
        not in ``lru``, cannot gain one)."""
        self.window[worker] = ev.window
        self._device.setdefault(worker, set())
        self._host.setdefault(worker, set())
        held = self.held(worker, tier)
        if isinstance(ev, BlockRemoved):
            held.difference_update(ev.block_hashes)
            return
        held.update(h for h in ev.block_hashes if h in lru)

    def cut(self, worker: WorkerId, hashes: Sequence[int], n: int) -> int:
        """``n`` leading device blocks of ``worker`` cut to its reusable prefix."""
        window = self.window.get(worker)
        if window is None or not n:
            return n
        return reusable_pages(hashes[:n], self._device[worker].__contains__, self.page_size, window)

    def cut_all(self, hashes: Sequence[int], result: dict[WorkerId, int]) -> dict:
        """Every worker's device prefix in ``result`` cut (workers left with none dropped)."""
        if not self.window:
            return result
        cut = ((w, self.cut(w, hashes, n)) for w, n in result.items())
        return {w: c for w, c in cut if c}

    def cut_tiers(self, worker: WorkerId, hashes: Sequence[int], d: int, n: int) -> int:
        """``n`` leading blocks of a windowed ``worker`` over both tiers, the first ``d`` on its
        device, cut to its reusable prefix: a device block counts its device window page, a
        host-only block its host window page (as the worker's own match does)."""
        device, host = self._device[worker], self._host[worker]

        def has(i: int) -> bool:
            return hashes[i] in (device if i < d else host)

        return reusable_pages(range(n), has, self.page_size, self.window[worker])
