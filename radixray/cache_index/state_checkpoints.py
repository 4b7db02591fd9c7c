"""``Checkpoints``: which radix-tree nodes hold a state checkpoint, their locks and their LRU.

A checkpoint is a slot id of the state pool (``worker/state_pool.py``) holding every state
layer's state after the node's last token. Kept beside the tree rather than on ``TreeNode``
(whose slots the plain radix caches share): a node's checkpoint is at its *end*, and a split
keeps the end on the original node object (``RadixTree._split``), so keying by node stays right
through splits. Ints only.

Eviction order: *spare* checkpoints first, then least recently *used checkpoint* first (a match
touches only the checkpoint it resumes from, an insert the ones it gives), and among equal times
the shallower first: a deeper checkpoint on the same path serves every request the shallower one
serves and more. A checkpoint is spare once a deeper one is given on its path (``spare``) and
until a match resumes from it (``resume``): a request leaves a checkpoint every interval, but
a chat's next turn resumes from the deepest, and an inner one pays only if another request
branches there, which a match at it shows. Without this, each new request's inner checkpoints,
the newest of all, pushed out older conversations' deepest ones (leaves, whose KV goes with
them): in the simulator finer intervals then hit less than checkpoints at request ends only
(benchmarks/README.md, "Hybrid models in the simulator").

A cache with a host tier keeps two of these (``mamba_host``): the device pool's slots and the
host state pool's; a node may hold one, the other, both (the same state) or neither.

Locks (``lock`` / ``unlock``, counted): a locked checkpoint is not evicted (a request that
matched it holds it until the engine has copied the state into its own slot).
"""

from __future__ import annotations

from .leaf_heap import LeafHeap
from .radix_tree import TreeNode

__all__ = ["Checkpoints", "direct_locks"]


def direct_locks(node: TreeNode) -> int:
    """Locks taken on ``node`` itself (a request's path ends here), not through a descendant."""
    return node.lock_ref - sum(c.lock_ref for c in node.children.values())


class Checkpoints:
    def __init__(self) -> None:
        self.slot: dict[TreeNode, int] = {}
        self.end: dict[TreeNode, int] = {}  # tokens from the root to the node's end
        self._access: dict[TreeNode, int] = {}
        self._locks: dict[TreeNode, int] = {}
        self._clock = 0
        self._spare: set[TreeNode] = set()  # a deeper one on the path, never resumed from
        self._resumed: set[TreeNode] = set()  # a match resumed from it: never spare again
        # unlocked checkpoints, in eviction order; priorities grow (access times, a spare one
        # resumed from) but for ``spare``, which pushes a fresh entry (LeafHeap's lazy refresh
        # then skips the stale one)
        self.lru = LeafHeap(lambda n: (n not in self._spare, self._access[n], self.end[n]))

    def __len__(self) -> int:
        return len(self.slot)

    def get(self, node: TreeNode) -> int | None:
        return self.slot.get(node)

    def tick(self) -> int:
        self._clock += 1
        return self._clock

    def set(self, node: TreeNode, slot: int, end: int, now: int) -> None:
        """``node`` (ending ``end`` tokens from its root) holds ``slot`` from now on."""
        assert node not in self.slot, f"{node!r} already holds checkpoint {self.slot[node]}"
        self.slot[node], self.end[node], self._access[node] = slot, end, now
        self._refresh(node)

    def access(self, node: TreeNode) -> int:
        """When ``node``'s checkpoint was last used (a moved checkpoint keeps its age)."""
        return self._access[node]

    def touch(self, node: TreeNode, now: int) -> None:
        if node in self.slot:
            self._access[node] = max(self._access[node], now)

    def resume(self, node: TreeNode, now: int) -> None:
        """A match resumes from ``node``'s checkpoint: used now, and never spare again."""
        self._resumed.add(node)
        self._spare.discard(node)
        self.touch(node, now)

    def spare(self, node: TreeNode) -> None:
        """A deeper checkpoint was given on ``node``'s path: unless a match has resumed from
        it, ``node``'s goes before every checkpoint that is not spare."""
        if node in self.slot and node not in self._resumed and node not in self._spare:
            self._spare.add(node)
            if node in self.lru:
                self.lru.lowered(node)

    def is_spare(self, node: TreeNode) -> bool:
        return node in self._spare

    def spare_above(self, node: TreeNode) -> None:
        """``spare`` every checkpoint above ``node`` (given one) on its path."""
        while (node := node.parent) is not None:
            self.spare(node)

    def drop(self, node: TreeNode) -> int:
        """Take ``node``'s checkpoint away; return its slot (the caller frees it)."""
        if self._locks.get(node):
            raise ValueError(f"checkpoint of {node!r} is locked")
        slot = self.slot.pop(node)
        del self.end[node], self._access[node]
        self._spare.discard(node)
        self._resumed.discard(node)
        self.lru.discard(node)
        return slot

    def lock(self, node: TreeNode) -> None:
        if node not in self.slot:
            raise ValueError(f"lock of a checkpoint that does not exist: {node!r}")
        self._locks[node] = self._locks.get(node, 0) + 1
        self.lru.discard(node)

    def unlock(self, node: TreeNode) -> None:
        if not self._locks.get(node):
            raise ValueError(f"unlock of a checkpoint that is not locked: {node!r}")
        self._locks[node] -= 1
        if not self._locks[node]:
            del self._locks[node]
        self._refresh(node)

    @property
    def locked(self) -> int:
        return sum(self._locks.values())

    def _refresh(self, node: TreeNode) -> None:
        self.lru.set_member(node, node in self.slot and not self._locks.get(node))

    def clear(self) -> list[int]:
        if self._locks:
            raise RuntimeError(f"cannot clear checkpoints while {self.locked} are locked")
        slots = list(self.slot.values())
        self.slot.clear()
        self.end.clear()
        self._access.clear()
        self._spare.clear()
        self._resumed.clear()
        self.lru.clear()
        return slots

    def check(self) -> None:
        """The LRU holds exactly the unlocked checkpoints; locks only on checkpoints."""
        unlocked = {n for n in self.slot if not self._locks.get(n)}
        if unlocked != self.lru.members:
            raise AssertionError(
                f"checkpoint LRU has {len(self.lru)} nodes, counted {len(unlocked)} unlocked"
            )
        for n in self._locks:
            if n not in self.slot:
                raise AssertionError(f"a lock on a node without a checkpoint: {n!r}")
