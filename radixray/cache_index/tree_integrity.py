"""``check_tree``: every invariant of a ``RadixTree`` and its pages in both tiers, recounted.

- structure: parents, page-multiple keys filed under their first page, one hash per page;
- tiers: a node's device pages and host pages are each empty or one per page, not both empty;
  device residency is closed under ancestors; ``device_children`` counts are right;
- locks: no negative counts, a node holds at least its children's locks;
- counters: device tokens, protected (locked device) tokens and host tokens match a recount;
- leaf sets: the device and host evictable leaves, and the droppable host copies, are exactly
  what the definitions give;
- pages: device pages free + cached (+ held) is every page once; host pages free + cached is
  every host page once.
"""

from __future__ import annotations

from collections.abc import Iterable

from .cache_contract import check_free_and_held
from .ghost import GhostList
from .page_allocator import PageAllocator
from .radix_tree import RadixTree, TreeNode

__all__ = ["check_tree"]


def check_tree(
    tree: RadixTree,
    ghost: GhostList,
    allocator: PageAllocator,
    host_allocator: PageAllocator | None,
    held_pages: Iterable[int] | None = None,
) -> None:
    total = protected = host_total = 0
    device_leaves, host_leaves, copies = set(), set(), set()
    cached: list[int] = []
    host_cached: list[int] = []
    for extra_key, root in tree.roots().items():
        if root.key or root.pages or root.host or root.parent is not None:
            raise AssertionError(f"root of namespace {extra_key!r} is not empty")
        stack = [root]
        while stack:
            node = stack.pop()
            child_locks = device_children = 0
            for first, child in node.children.items():
                _check_node(tree.page_size, child, node, first)
                child_locks += child.lock_ref
                device_children += bool(child.pages)
                stack.append(child)
            if node.device_children != device_children:
                raise AssertionError(
                    f"device_children {node.device_children} != counted {device_children} "
                    f"at {node!r}"
                )
            if node.parent is None:
                continue
            if node.lock_ref < child_locks:
                raise AssertionError(
                    f"lock_ref {node.lock_ref} < children's {child_locks} at {node!r}"
                )
            if node.pages:
                total += len(node.key)
                protected += len(node.key) if node.lock_ref else 0
                if not node.lock_ref and not device_children:
                    device_leaves.add(node)
            elif not node.lock_ref and not node.children:
                host_leaves.add(node)
            if node.pages and node.host and not node.lock_ref:
                copies.add(node)
            host_total += len(node.key) if node.host else 0
            cached += node.pages
            host_cached += node.host
    _check_counts(tree, total, protected, host_total, device_leaves, host_leaves)
    if copies != tree.host_copies.members:
        raise AssertionError(
            f"host copy set has {len(tree.host_copies)} nodes, counted {len(copies)}"
        )
    if len(ghost) > ghost.capacity:
        raise AssertionError("ghost list over capacity")
    check_free_and_held(allocator, cached, held_pages)
    if host_allocator is not None:
        check_free_and_held(host_allocator, host_cached, [])
    elif host_cached:
        raise AssertionError("host pages cached without a host tier")


def _check_counts(tree, total, protected, host_total, device_leaves, host_leaves) -> None:
    if total != tree.total_tokens:
        raise AssertionError(f"total_tokens {tree.total_tokens} != counted {total}")
    if protected != tree.protected_tokens:
        raise AssertionError(f"protected_tokens {tree.protected_tokens} != counted {protected}")
    if host_total != tree.host_tokens:
        raise AssertionError(f"host_tokens {tree.host_tokens} != counted {host_total}")
    if device_leaves != tree.device_leaves.members:
        raise AssertionError(
            f"evictable leaf set has {len(tree.device_leaves)} nodes, counted {len(device_leaves)}"
        )
    if host_leaves != tree.host_leaves.members:
        raise AssertionError(
            f"host leaf set has {len(tree.host_leaves)} nodes, counted {len(host_leaves)}"
        )


def _check_node(P: int, node: TreeNode, parent: TreeNode, first: tuple) -> None:
    if node.parent is not parent:
        raise AssertionError(f"{node!r} has the wrong parent")
    if not node.key or len(node.key) % P:
        raise AssertionError(f"{node!r} key length {len(node.key)} is not a page multiple")
    if tuple(node.key[:P]) != first:
        raise AssertionError(f"{node!r} is filed under the wrong first page")
    n = len(node.key) // P
    if len(node.hashes) != n or len(node.pages) not in (0, n) or len(node.host) not in (0, n):
        raise AssertionError(
            f"{node!r} has {len(node.pages)} device pages, {len(node.host)} host pages, "
            f"{len(node.hashes)} hashes for {len(node.key)} tokens"
        )
    if not node.pages and not node.host:
        raise AssertionError(f"{node!r} holds no pages in either tier")
    if node.pages and parent.parent is not None and not parent.pages:
        raise AssertionError(f"{node!r} is device-resident under a host-only parent")
    if node.lock_ref < 0:
        raise AssertionError(f"{node!r} has a negative lock_ref")
