"""One walk down an inserted path to the nodes that end at a request's checkpoint positions.

``MambaRadixCache.insert`` inserts a request's prefix once, up to its last checkpoint, and
then needs, for every checkpoint position ``p``, the node ending exactly at ``p`` (splitting
the node that ``p`` falls inside) and the nodes between the previous position and ``p`` that
got device pages from this insert (``RadixCache._stored`` gives them their ``BlockStored``,
one per segment as an insert per position gave). Walking the path once costs
O(depth + checkpoints); an insert and a match per position cost O(checkpoints * depth), which
at per-page intervals dominated the simulator's hybrid runs.
"""

from __future__ import annotations

from collections.abc import Sequence

from .radix_tree import RadixTree, TreeNode

__all__ = ["walk_to_positions"]


def walk_to_positions(
    tree: RadixTree, tokens: list[int], extra_key: str | None, positions: Sequence[int], new: int
) -> list[tuple[int, TreeNode, list[TreeNode]]]:
    """For each of the ascending page-multiple ``positions`` (all on the device path of
    ``tokens``): (the position, the node ending there, the nodes since the previous position
    that start at or after ``new``, the tokens device-cached before the insert, in path
    order). A node that a position falls inside is split there, as a match of ``tokens[:p]``
    would. Access times and hit counts are left alone: an insert is not a hit."""
    P = tree.page_size
    node = tree.root(extra_key)
    pos = 0
    out: list[tuple[int, TreeNode, list[TreeNode]]] = []
    for p in positions:
        seg: list[TreeNode] = []
        while pos < p:
            child = node.children[tuple(tokens[pos : pos + P])]
            klen = len(child.key)
            if pos + klen > p:
                child, klen = tree._split(child, p - pos), p - pos  # noqa: SLF001
            if pos >= new:
                seg.append(child)
            pos += klen
            node = child
        out.append((p, node, seg))
    return out
