"""``MambaHostTier``: the host tier of a ``MambaRadixCache`` (docs/state_cache.md, "Host tier").

A node of a state cache holds KV pages and maybe a state checkpoint; with a host tier each of
the two has a device and a host residency. KV moves as ``HostTier`` moves it; a checkpoint is a
slot of the device state pool or of the host state pool (its own allocator of ints), or both
(the same state: checkpoints never change once taken), and it goes where its node goes::

    demote(node)       KV to the host (``HostTier``); the node's device checkpoint is demoted
                       with it: copied to a host state slot (unless it has one already), its
                       device slot freed. When no host slot can be had (every host checkpoint
                       is locked) a childless node is not demoted (the caller forgets it) and an
                       inner one becomes a tombstone
    keep(node)         the device state pool is short (``evict_states``): a device node's
                       checkpoint moves to the host instead of being dropped; its KV stays
    load_back(...)     KV back to the device (``HostTier``); the checkpoint stays on the host:
                       the request resuming there gets it copied from its host slot into its
                       own device slot before its first forward (``StateCopy(host=True)``), as a
                       device checkpoint is copied, never shared
    make_state_room(n) free host slots: first the host copies of checkpoints the device holds
                       too (nothing is lost), then the least recently used; a node left with no
                       checkpoint is a tombstone, or, childless, leaves the tree (``orphans``:
                       the cache removes it and the tombstones it leaves as leaves)

So "no leaf is a tombstone" holds over both tiers: every childless node has a checkpoint on the
device or on the host. A device checkpoint only sits on a node with device KV; a host one on any
node (after a load-back its KV is on the device, its checkpoint still on the host).

Copies are ``PageCopy(state=True)`` from device slots to host slots, in the same ordered list
as the KV copies (the engine runs them before the next forward). KV events: a host checkpoint
is a ``mamba``-group store on the host medium ("CPU"), sent after the full group's events of the
demotion; losing it (evicted) a host-medium removal; a node that leaves the tree is removed
from both groups by the full group's removals. Ints only, like the rest of ``cache_index``.
"""

from __future__ import annotations

from .events import MAMBA, BlockRemoved, BlockStored
from .host_tier import HOST, HostTier
from .page_allocator import PageAllocator
from .radix_tree import TreeNode
from .state_checkpoints import Checkpoints, direct_locks

__all__ = ["MambaHostTier", "STATE_GROUP", "check_states", "state_stored"]

STATE_GROUP = 1  # the mamba group's group_idx in KV events


def state_stored(node: TreeNode, P: int, medium: str | None) -> BlockStored:
    """The mamba group's store of ``node``'s last block (its end holds a checkpoint)."""
    parent = node.hashes[-2] if len(node.hashes) > 1 else node.parent.last_hash
    return BlockStored([node.hashes[-1]], parent, list(node.key[-P:]), P, medium, STATE_GROUP,
                       MAMBA)  # fmt: skip


class MambaHostTier(HostTier):
    def __init__(
        self, allocator, tree, ghost, emit, slots: PageAllocator, device: Checkpoints,
        device_slots: PageAllocator,
    ):  # fmt: skip
        if not isinstance(slots, PageAllocator):
            raise ValueError(
                "a state cache's host tier needs host_state_allocator (a PageAllocator of host "
                f"state slots), got {slots!r}"
            )
        super().__init__(allocator, tree, ghost, emit)
        self.slots = slots  # the host state pool's slot ids
        self.ckpt = Checkpoints()  # host checkpoints
        self.device = device  # the cache's device checkpoints
        self.device_slots = device_slots
        self.orphans: list[TreeNode] = []  # nodes that may be childless tombstones now
        self.demoted_states = 0  # checkpoints copied to the host
        self.evicted_states = 0  # host checkpoints dropped by make_state_room

    def has_state(self, node: TreeNode) -> bool:
        return self.device.get(node) is not None or self.ckpt.get(node) is not None

    def spare_above(self, node: TreeNode) -> None:
        """``Checkpoints.spare_above`` on both tiers: a host-only checkpoint above a deeper one
        just given is spare too (a request went past it without resuming there)."""
        self.device.spare_above(node)
        self.ckpt.spare_above(node)

    # ------------------------------------------------------------------ moves

    def demote(self, node: TreeNode) -> list[int] | None:
        """``HostTier.demote`` with the node's checkpoint (see the module's doc)."""
        host_slot = None
        if self.device.get(node) is not None and self.ckpt.get(node) is None:
            host_slot = self._host_slot()
            if host_slot is None and not node.children:
                return None  # its KV alone could never be resumed from
        pages = super().demote(node)
        if pages is None:
            if host_slot is not None:
                self.slots.free([host_slot])
            return None
        slot = self.device.get(node)
        if slot is not None:
            if host_slot is not None:
                self._adopt(node, slot, host_slot)
            self._carry_spare(node)
            self.device.drop(node)
            self.device_slots.free([slot])  # its copy out is recorded first
        if not self.has_state(node):
            self.orphans.append(node)
        return pages

    def keep(self, node: TreeNode) -> bool:
        """Give the device checkpoint of ``node`` a host copy (unless it has one); False when
        no host slot can be had. The caller then drops the device one."""
        if self.ckpt.get(node) is None:
            host_slot = self._host_slot()
            if host_slot is None:
                return False
            self._adopt(node, self.device.get(node), host_slot)
        self._carry_spare(node)
        return True

    def _adopt(self, node: TreeNode, slot: int, host_slot: int) -> None:
        """``node``'s device checkpoint ``slot`` is copied to ``host_slot`` (announced)."""
        self._record(True, [slot], [host_slot], state=True)
        self.ckpt.set(node, host_slot, self.device.end[node], self.device.access(node))
        self.demoted_states += 1
        if self.emit:
            self.emit(state_stored(node, self.P, HOST))

    def _carry_spare(self, node: TreeNode) -> None:
        """The device checkpoint of ``node`` is dropped for its host one: a spare one (a deeper
        one on its path, no match resumed from it) stays spare there, to go first there too."""
        if self.device.is_spare(node):
            self.ckpt.spare(node)

    def _host_slot(self) -> int | None:
        return self.slots.alloc(1)[0] if self.make_state_room(1) else None

    def make_state_room(self, n: int) -> bool:
        """Free host slots until ``n`` are free: host copies of device checkpoints first, then
        host checkpoints in ``Checkpoints``' order (spare ones, then least recently used),
        skipping those where a request's lock ends (as ``evict_states`` does). False when even
        that is not enough."""
        held: list[TreeNode] = []
        try:
            while self.slots.num_free < n:
                node = self._oldest_copy()
                if node is None:
                    node = self.ckpt.lru.pop()
                    if node is None:
                        return False
                    if direct_locks(node):
                        held.append(node)
                        continue
                self.drop_state(node)
            return True
        finally:
            for node in held:
                self.ckpt.lru.add(node)

    def _oldest_copy(self) -> TreeNode | None:
        copies = [n for n in self.ckpt.lru.members if self.device.get(n) is not None]
        return min(copies, key=lambda n: (self.ckpt.access(n), self.ckpt.end[n]), default=None)

    def drop_state(self, node: TreeNode) -> None:
        """Free ``node``'s host checkpoint (unlocked); a node left without one is an orphan."""
        self.slots.free([self.ckpt.drop(node)])
        self.evicted_states += 1
        if self.emit:
            self.emit(BlockRemoved([node.hashes[-1]], HOST, STATE_GROUP, MAMBA))
        if not self.has_state(node):
            self.orphans.append(node)

    def forget(self, node: TreeNode) -> None:
        """``HostTier.forget`` with the node's host checkpoint; its parent may be an orphan."""
        if self.ckpt.get(node) is not None:
            self.slots.free([self.ckpt.drop(node)])
        super().forget(node)
        self.orphans.append(node.parent)

    def free_all(self, nodes) -> None:
        super().free_all(nodes)
        self.slots.free(self.ckpt.clear())
        self.orphans.clear()


def check_states(tree, device: Checkpoints, host: Checkpoints | None) -> None:
    """The checkpoints of a state cache's tree (``host``: its host tier's, or None): each on a
    node of the tree at the position it says, a device one only where the node's KV is on the
    device, no childless node without one, their LRUs and locks."""
    device.check()
    if host is not None:
        host.check()
    seen = 0
    for root in tree.roots().values():
        stack = [(c, 0) for c in root.children.values()]
        while stack:
            node, start = stack.pop()
            end = start + len(node.key)
            held = [(c, what) for c, what in ((device, "device"), (host, "host"))
                    if c is not None and c.get(node) is not None]  # fmt: skip
            if not node.children and not held:
                raise AssertionError(f"leaf {node!r} is a tombstone (no checkpoint)")
            for c, what in held:
                seen += 1
                if c.end[node] != end:
                    raise AssertionError(f"{what} checkpoint of {node!r} says {c.end[node]} "
                                         f"tokens, is {end}")  # fmt: skip
                if what == "device" and not node.pages:
                    raise AssertionError(f"device checkpoint on {node!r}, whose KV is not there")
            stack += [(c, end) for c in node.children.values()]
    total = len(device) + (len(host) if host is not None else 0)
    if seen != total:
        raise AssertionError(f"{total - seen} checkpoints on nodes not in the tree")
