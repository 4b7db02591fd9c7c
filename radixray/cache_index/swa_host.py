"""``SWAHostTier``: the host tier of a ``SWARadixCache`` (docs/window_cache.md, docs/host_tier.md).

Host pages come from a ``WindowedAllocator`` too: each host page may own one host window page,
the window layers' KV of its positions. The rules are the window cache's own:

    demote(node)     full pages go to the host as ``HostTier`` moves them; each device window
                     page goes with its page if it is within a window of the nearest leaf end
                     below the node (``evict_window``'s first rule: the ends stay reusable) and
                     the host window pool has room, else it is dropped (a host tombstone); the
                     kept ones are announced: window-group stores on the host ("CPU"), after
                     the full group's host store, before its device remove
    load_back(...)   full pages come back as ``HostTier`` brings them; window pages only for the
                     last window before the match end (what a request starting there reads):
                     copied from the host where the host has them, the other loaded pages'
                     device window pages dropped

Window copies are ``PageCopy(window=True)`` between the window pools' ids. A host page keeps its
window page until the host page itself is freed (``forget``, ``free_all``: the allocator frees
both). Ints only, like the rest of ``cache_index``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from .events import SLIDING_WINDOW, BlockRemoved, BlockStored
from .host_tier import HOST, HostTier
from .radix_tree import TreeNode
from .window_pages import WindowedAllocator

__all__ = ["SWAHostTier", "WINDOW_GROUP", "in_window_group", "nearest_end_below", "window_runs"]

WINDOW_GROUP = 1  # the group_idx of window-layer blocks in KV events (0: full attention)


def in_window_group(ev: BlockStored | BlockRemoved, window: int):
    """``ev`` as an event of the window group (layers with a ``window``-token window)."""
    return replace(ev, group_idx=WINDOW_GROUP, kind=SLIDING_WINDOW, window=window)


def window_runs(
    hashes: Sequence[int],
    parent: int | None,
    tokens: Sequence[int],
    present: Iterable[bool],
    P: int,
    medium: str | None,
    window: int,
) -> list[BlockStored]:
    """Window-group ``BlockStored`` events (on ``medium``'s tier) for the runs of pages, of a
    node's ``hashes`` and ``tokens``, that have their window pages (``present``)."""
    out, run = [], []
    for i, ok in enumerate([*present, False]):
        if ok:
            run.append(i)
            continue
        if run:
            a, b = run[0], run[-1] + 1
            par = hashes[a - 1] if a else parent
            ev = BlockStored(list(hashes[a:b]), par, list(tokens[a * P : b * P]), P, medium)
            out.append(in_window_group(ev, window))
            run = []
    return out


def nearest_end_below(node: TreeNode, cap: int) -> int:
    """Tokens from ``node``'s end to the nearest leaf end in its subtree (0 for a leaf), or
    ``cap`` if every leaf end is at least that far (the walk stops there)."""
    if not node.children:
        return 0
    best = cap
    stack = [(c, len(c.key)) for c in node.children.values()]
    while stack:
        n, d = stack.pop()
        if d >= best:
            continue
        if not n.children:
            best = d
            continue
        stack.extend((c, d + len(c.key)) for c in n.children.values())
    return best


class SWAHostTier(HostTier):
    def __init__(self, allocator: WindowedAllocator, tree, ghost, emit, device: WindowedAllocator):
        if not isinstance(allocator, WindowedAllocator):
            raise TypeError("a window cache's host tier needs a WindowedAllocator (host windows)")
        super().__init__(allocator, tree, ghost, emit)
        self.device = device
        self.window = device.window
        self.demoted_window_pages = 0
        self.loaded_window_pages = 0

    def _alloc_host(self, n: int) -> list[int]:
        return self.allocator.alloc(n, window=False)  # window pages: ``_demote_windows``

    def _demoted(self, node: TreeNode) -> None:
        """A node's first demotion: its window pages that stay reusable go to the host too,
        announced as window-group stores on the host (before the device remove)."""
        self._demote_windows(node, node.pages)
        if self.emit:
            has = self.allocator.has_window
            present = map(has, node.host)
            for ev in window_runs(node.hashes, node.parent.last_hash, node.key, present, self.P,
                                  HOST, self.window):  # fmt: skip
                self.emit(ev)

    def _demote_windows(self, node: TreeNode, pages: list[int]) -> None:
        """Copy the window pages of a demoted node's device ``pages`` that stay reusable."""
        P, W, dev = self.P, self.window, self.device
        below = nearest_end_below(node, W)
        k = len(pages)
        keep = [j for j in range(k) if dev.window_of(pages[j]) >= 0 and (k - 1 - j) * P + below < W]
        if not keep:
            return
        got = self.allocator.give_window([node.host[j] for j in keep])
        keep = keep[len(keep) - len(got) :]
        if got:
            self._record(True, [dev.window_of(pages[j]) for j in keep], got, window=True)
            self.demoted_window_pages += len(got)

    def load_back(self, device_node: TreeNode, host_node: TreeNode, pages: list[int]) -> None:
        offset, node = 0, device_node
        while node.parent is not None:
            offset += len(node.key) // self.P
            node = node.parent
        host: list[int] = []
        node = host_node
        while node is not device_node:
            host = node.host + host
            node = node.parent
        super().load_back(device_node, host_node, pages)
        end = offset + len(pages)
        first = max(0, end * self.P - self.window + 1) // self.P  # the first page end reads
        src, dst, drop = [], [], []
        hw, dw = self.allocator.window_of, self.device.window_of
        for i, (h, d) in enumerate(zip(host, pages, strict=True)):
            if offset + i >= first and hw(h) >= 0 and dw(d) >= 0:
                src.append(hw(h))
                dst.append(dw(d))
            else:
                drop.append(d)
        if src:
            self._record(False, src, dst, window=True)
            self.loaded_window_pages += len(src)
        self.device.drop_window(drop)
