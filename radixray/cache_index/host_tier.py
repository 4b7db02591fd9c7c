"""``HostTier``: the host-memory tier behind a ``RadixCache``. Ints only: it decides which pages
move and records the copies; the engine moves the bytes (``take_copies``, before the next forward).

    demote(node)       device eviction of a leaf: copy its pages to host pages (unless it has a
                       host copy already), free its device pages; the node stays, host-resident
    make_room(n)       free ``n`` host pages: drop the host copies of device-resident nodes (LRU;
                       nothing is lost: they stay on the device), then evict host-only LRU leaves
    write_through(...) copy the device nodes on a path hit N times or more to the host tier now
                       (they keep their device pages), so their demotion later copies nothing
    load_back(...)     host-only nodes on a matched path get device pages (copies host -> device);
                       they keep their host copy, so a later demotion frees without copying

Events (``medium`` names the tier: "GPU" the device pool, "CPU" this tier): a demotion sends the
host store before the device remove; a load-back a device store and no host remove; a host
eviction, or a dropped host copy, a host remove. Copies are recorded in order: a device page
demoted and then reused by the next step is copied out before that step writes it (layer by
layer); a host page freed by a dropped copy and reused by a demotion is read by any load-back
recorded before it. See docs/host_tier.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from .events import BlockRemoved, BlockStored, KVEvent
from .ghost import GhostList
from .page_allocator import PageAllocator
from .radix_tree import RadixTree, TreeNode

__all__ = ["HostTier", "PageCopy", "DEVICE", "HOST"]

DEVICE = "GPU"  # the device pool's medium in events (also on a CPU worker)
HOST = "CPU"  # the host tier's


class PageCopy(NamedTuple):
    """Copy page ``src[i]`` to page ``dst[i]`` (all layers, K and V)."""

    to_host: bool  # True: device -> host (a demotion); False: host -> device (a load-back)
    src: list[int]
    dst: list[int]
    window: bool = False  # True: window-pool pages (``swa_host``), ids of the window pools
    # True: state slots, not pages (``mamba_host``): device state-pool slot <-> host state slot
    state: bool = False


class HostTier:
    def __init__(
        self,
        allocator: PageAllocator,
        tree: RadixTree,
        ghost: GhostList,
        emit: Callable[[KVEvent], None] | None = None,
    ):
        self.allocator = allocator
        self.tree = tree
        self.ghost = ghost
        self.emit = emit
        self.P = tree.page_size
        self._copies: list[PageCopy] = []
        self._group_dst: set[int] = set()
        # counters (pages, except demotions/loads: nodes and load-backs)
        self.demotions = 0
        self.demoted_pages = 0
        self.loads = 0
        self.loaded_pages = 0
        self.evicted_pages = 0
        self.dropped_copy_pages = 0
        self.written_through_pages = 0

    # ------------------------------------------------------------------ copies

    def _record(
        self, to_host: bool, src: list[int], dst: list[int], window: bool = False, state=False
    ) -> None:
        """Append a copy, merged into the last one when it goes the same way between the same
        pools and writes none of the same pages (then the merged copy has distinct targets)."""
        last = self._copies[-1] if self._copies else None
        if (
            last is not None
            and (last.to_host, last.window, last.state) == (to_host, window, state)
            and self._group_dst.isdisjoint(dst)
        ):
            last.src.extend(src)
            last.dst.extend(dst)
        else:
            self._copies.append(PageCopy(to_host, list(src), list(dst), window, state))
            self._group_dst = set()
        self._group_dst.update(dst)

    def take_copies(self) -> list[PageCopy]:
        """The copies recorded since the last call, in the order they must run."""
        copies, self._copies = self._copies, []
        self._group_dst = set()
        return copies

    # ------------------------------------------------------------------ moves

    def demote(self, node: TreeNode) -> list[int] | None:
        """Move an unlocked device leaf to the host tier; return its device pages (the caller
        frees them), or None (nothing changed) when the host tier has no room for it."""
        if not node.host:
            n = len(node.pages)
            if not self.make_room(n):
                return None
            host = self._alloc_host(n)
            self.tree.set_host(node, host)
            self._record(True, node.pages, host)
            self.demotions += 1
            self.demoted_pages += n
            if self.emit:
                self.emit(BlockStored(list(node.hashes), node.parent.last_hash, list(node.key),
                                      self.P, HOST))  # fmt: skip
            self._demoted(node)
        if self.emit:
            self.emit(BlockRemoved(list(node.hashes), DEVICE))
        return self.tree.drop_device(node)

    def _alloc_host(self, n: int) -> list[int]:
        return self.allocator.alloc(n)

    def _demoted(self, node: TreeNode) -> None:
        """A subclass's hook: ``node``'s device pages (still ``node.pages``) were just copied to
        its new host pages and the host store sent; its device remove follows."""

    def write_through(self, node: TreeNode, min_hits: int) -> int:
        """Give every device node from ``node`` up to the root that was hit ``min_hits`` times or
        more and has no host copy a host copy (a store event each, parents first); return the
        pages copied. The caller holds a lock on ``node``, so making room evicts nothing on the
        path; where even the unlocked host leaves are not room enough, it stops."""
        path: list[TreeNode] = []
        while node.parent is not None:
            if node.pages and not node.host and node.hits >= min_hits:
                path.append(node)
            node = node.parent
        copied = 0
        for n in reversed(path):
            k = len(n.pages)
            if not self.make_room(k):
                break
            host = self._alloc_host(k)
            self.tree.set_host(n, host)
            self._record(True, n.pages, host)
            copied += k
            if self.emit:
                self.emit(
                    BlockStored(list(n.hashes), n.parent.last_hash, list(n.key), self.P, HOST)
                )
        self.written_through_pages += copied
        return copied

    def make_room(self, n: int) -> bool:
        """Free host pages until ``n`` are free: first the host copies of unlocked
        device-resident nodes (least recently used first; a copy is the same KV as the device
        pages, so the two tiers keep every prefix they held, and the node's next demotion
        copies it again), then host-only leaves (LRU; their prefix is gone). So the tiers hold
        as many distinct pages as one pool of both sizes. False when even all of them are not
        enough (what was dropped stays dropped)."""
        while self.allocator.num_free < n:
            node = self.tree.host_copies.pop()
            if node is not None:
                self.drop_copy(node)
                continue
            node = self.tree.host_leaves.pop()
            if node is None:
                return False
            self.forget(node)
        return True

    @property
    def spare_pages(self) -> int:
        """Host pages a demotion can take without losing a prefix: the free ones and the
        unlocked host copies of device-resident nodes (``make_room`` drops those first)."""
        return self.allocator.num_free + sum(len(n.host) for n in self.tree.host_copies.members)

    def drop_copy(self, node: TreeNode) -> None:
        """Free the host copy of a device-resident node; it stays on the device (a host remove
        is sent, the device store stands)."""
        host = node.host
        self.tree.set_host(node, [])
        self.allocator.free(host)
        self.dropped_copy_pages += len(host)
        if self.emit:
            self.emit(BlockRemoved(list(node.hashes), HOST))

    def forget(self, node: TreeNode) -> None:
        """Drop a host-only childless node from the tree and free its host pages."""
        self.tree.remove(node)
        self.allocator.free(node.host)
        self.evicted_pages += len(node.host)
        self.ghost.add(node.hashes)
        if self.emit:
            self.emit(BlockRemoved(list(node.hashes), HOST))

    def forget_below(self, node: TreeNode) -> None:
        """Forget every descendant of ``node`` (host-only and unlocked: ``node`` is an unlocked
        device leaf), deepest first."""
        order: list[TreeNode] = []
        stack = list(node.children.values())
        while stack:
            n = stack.pop()
            order.append(n)
            stack.extend(n.children.values())
        for n in reversed(order):
            self.forget(n)

    def load_back(self, device_node: TreeNode, host_node: TreeNode, pages: list[int]) -> None:
        """Give the host-only nodes from ``device_node`` (exclusive) down to ``host_node`` the
        device ``pages``, in path order, and record the copies. The caller holds a lock on
        ``host_node`` (so nothing on the path was evicted since the match)."""
        path: list[TreeNode] = []
        node = host_node
        while node is not device_node:
            path.append(node)
            node = node.parent
        path.reverse()
        if sum(len(n.host) for n in path) != len(pages):
            raise ValueError(f"load_back of {len(pages)} pages onto a path of other length")
        i = 0
        hashes: list[int] = []
        key: list[int] = []
        for node in path:
            k = len(node.host)
            dev = list(pages[i : i + k])
            i += k
            self._record(False, node.host, dev)
            self.tree.set_device(node, dev)
            hashes += node.hashes
            key += node.key
        self.loads += 1
        self.loaded_pages += len(pages)
        if self.emit and path:
            self.emit(BlockStored(hashes, device_node.last_hash, key, self.P, DEVICE))

    def free_all(self, nodes) -> None:
        """Free the host pages of ``nodes`` (a reset; the tree is cleared by the caller)."""
        pages = [p for n in nodes for p in n.host]
        self.allocator.free(pages)
