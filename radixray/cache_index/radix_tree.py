"""A page-granular radix tree: match, insert, split, lock refs and an eviction-ordered leaf heap.

Every edge holds a whole number of pages. Children are keyed by their first page (a tuple of
``page_size`` tokens), so a lookup costs one dict probe per node, and a node is only ever split at
a page boundary. Example with page_size 2 after inserting ``abcdef`` and ``abcdxy``::

    root
     └── (a b)(c d)            pages [0, 1]
          ├── (e f)            pages [2]
          └── (x y)            pages [5]

A node's ``pages`` are the KV pages of its key (one id per page) and ``hashes`` the chained block
hashes of those pages (``block_hash.hash_blocks`` from the root), which do not change when a node
is split: a page's hash depends only on the tokens before and in it.

Lock refs: ``lock(node)`` adds one to the node and every ancestor; a node whose lock_ref is > 0 is
protected from eviction. Since ancestors always hold at least the locks of their descendants, the
unlocked nodes form whole subtrees hanging off the locked part, and repeatedly evicting unlocked
leaves can reach every unlocked token.

The evictable leaves (no children, lock_ref 0) are kept in a set and a heap ordered by the eviction
policy. Priorities only grow (a later access time, a larger hit count), so the heap is refreshed
lazily: a popped entry whose priority is stale is pushed back with the current one. The popped
entry is the true minimum once its stored priority is current, because every other entry's stored
priority is a lower bound of its node's current one.

This module knows nothing of allocators or events: ``radix_cache.RadixCache`` owns those.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence

__all__ = ["TreeNode", "RadixTree", "EVICTION_POLICIES"]

# The heap key of a node under each eviction policy; the smallest is evicted first.
# lru: least recently used. lfu: fewest hits, then least recently used.
EVICTION_POLICIES: dict[str, Callable[[TreeNode], object]] = {
    "lru": lambda n: n.last_access,
    "lfu": lambda n: (n.hits, n.last_access),
}


class TreeNode:
    __slots__ = ("key", "pages", "hashes", "children", "parent", "lock_ref", "last_access", "hits")

    def __init__(
        self,
        key: list[int] | None = None,
        pages: list[int] | None = None,
        hashes: list[int] | None = None,
        parent: TreeNode | None = None,
    ):
        self.key: list[int] = key if key is not None else []
        self.pages: list[int] = pages if pages is not None else []
        self.hashes: list[int] = hashes if hashes is not None else []
        self.children: dict[tuple[int, ...], TreeNode] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = 0
        self.hits = 0

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def last_hash(self) -> int | None:
        """The hash of this node's last page (None for a root)."""
        return self.hashes[-1] if self.hashes else None

    def __repr__(self) -> str:
        return (
            f"TreeNode(tokens={len(self.key)}, pages={self.pages}, lock_ref={self.lock_ref}, "
            f"children={len(self.children)})"
        )


class RadixTree:
    """The tree structure and its bookkeeping; one root per ``extra_key`` namespace."""

    def __init__(self, page_size: int, eviction: str = "lru"):
        if eviction not in EVICTION_POLICIES:
            raise ValueError(
                f"eviction must be one of {sorted(EVICTION_POLICIES)}, got {eviction!r}"
            )
        self.page_size = page_size
        self.eviction = eviction
        self._priority = EVICTION_POLICIES[eviction]
        self._roots: dict[str | None, TreeNode] = {}
        self._clock = 0  # logical time: one tick per match/insert, so LRU order is exact
        self.total_tokens = 0
        self.protected_tokens = 0
        self._leaves: set[TreeNode] = set()  # evictable leaves
        self._heap: list[tuple[object, int, TreeNode]] = []
        self._push_seq = 0

    # ------------------------------------------------------------------ navigation

    def root(self, extra_key: str | None = None) -> TreeNode:
        node = self._roots.get(extra_key)
        if node is None:
            node = self._roots[extra_key] = TreeNode()
        return node

    def roots(self) -> dict[str | None, TreeNode]:
        return self._roots

    def iter_nodes(self) -> Iterator[TreeNode]:
        """Every non-root node, parents before children."""
        stack = [c for r in self._roots.values() for c in r.children.values()]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    @property
    def evictable_tokens(self) -> int:
        return self.total_tokens - self.protected_tokens

    @property
    def evictable_leaves(self) -> set[TreeNode]:
        return self._leaves

    # ------------------------------------------------------------------ match / insert

    def match(self, tokens: list[int], extra_key: str | None = None) -> tuple[list, TreeNode]:
        """Longest page-aligned cached prefix of ``tokens``: (pages, last matched node).

        ``tokens`` must be a list (node keys are lists: comparing list slices in C is what
        makes a 4k-token match cheap; a child is found by its first page as a tuple).

        Splits the node where the match ends inside it, so the returned node ends exactly at the
        match. Touches every node on the path (access time, hit count).
        """
        if type(tokens) is not list:  # a tuple slice never equals a list key
            tokens = list(tokens)
        P = self.page_size
        n = len(tokens) - len(tokens) % P
        node = self._roots.get(extra_key)
        if node is None:
            return [], self.root(extra_key)
        self._clock += 1
        now = self._clock
        pages: list[int] = []
        pos = 0
        while pos < n:
            child = node.children.get(tuple(tokens[pos : pos + P]))
            if child is None:
                break
            klen = len(child.key)
            if pos + klen > n or tokens[pos : pos + klen] != child.key:
                # The match ends inside this node: split it so the handle ends at the match.
                # The next lookup then finds no child and the loop stops.
                klen = self._common_len(child.key, tokens, pos, n)
                child = self._split(child, klen)
            child.last_access = now
            child.hits += 1
            pages += child.pages
            pos += klen
            node = child
        return pages, node

    def peek(self, tokens: list[int], hashes: Sequence[int], extra_key: str | None = None) -> int:
        """Cached tokens of ``tokens``'s longest page-aligned prefix, read-only and cheap.

        ``hashes`` are the chained block hashes of ``tokens``'s full pages (``hash_blocks``),
        and only that many pages are looked at. Each edge is checked by its last page's hash
        (chained: equal hashes mean equal prefixes) instead of comparing every token, so a walk
        costs O(edges), not O(tokens). Nothing changes: no split, no access time, no hit count.
        For estimates (admission order), not for taking pages: ``match`` compares tokens.
        """
        P = self.page_size
        node = self._roots.get(extra_key)
        n = len(hashes)
        pg = 0
        while node is not None and pg < n:
            child = node.children.get(tuple(tokens[pg * P : (pg + 1) * P]))
            if child is None:
                break
            h = child.hashes
            k = len(h)
            if pg + k <= n and h[-1] == hashes[pg + k - 1]:
                pg += k
                node = child
                continue
            # The match ends inside this edge. Its first page matched (same tokens after the
            # same parent); chained hashes agree up to the first difference: binary search.
            lo, hi = 1, min(k, n - pg)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if h[mid - 1] == hashes[pg + mid - 1]:
                    lo = mid
                else:
                    hi = mid - 1
            pg += lo
            break
        return pg * P

    def insert(
        self,
        tokens: list[int],
        pages: list[int],
        hash_fn: Callable[[int, list[int], int | None], list[int]],
        extra_key: str | None = None,
    ) -> tuple[int, TreeNode | None]:
        """Insert the page-aligned part of ``tokens`` with ``pages[i]`` holding page ``i``.

        Returns (tokens already cached, the new leaf or None). Pages of the already-cached part
        are not adopted: the tree keeps its own. ``hash_fn(first_page, key, parent_hash)`` gives
        the hashes of a new node's pages (``key`` starts at page ``first_page`` of ``tokens``).
        """
        if type(tokens) is not list:  # a tuple slice never equals a list key
            tokens = list(tokens)
        P = self.page_size
        n = len(tokens) - len(tokens) % P
        node = self.root(extra_key)
        self._clock += 1
        now = self._clock
        pos = 0
        while pos < n:
            child = node.children.get(tuple(tokens[pos : pos + P]))
            if child is None:
                break
            klen = len(child.key)
            if pos + klen > n or tokens[pos : pos + klen] != child.key:
                klen = self._common_len(child.key, tokens, pos, n)
                child = self._split(child, klen)
            child.last_access = now
            pos += klen
            node = child
        if pos >= n:
            return pos, None
        key = tokens[pos:n]
        hashes = hash_fn(pos // P, key, node.last_hash)
        leaf = TreeNode(key, list(pages[pos // P : n // P]), hashes, node)
        leaf.last_access = now
        node.children[tuple(key[:P])] = leaf
        self.total_tokens += len(key)
        self._leaves.discard(node)  # it has a child now
        self._add_leaf(leaf)
        return pos, leaf

    def _common_len(self, key: list, tokens: list, pos: int, n: int) -> int:
        """Matched tokens of ``key`` against ``tokens[pos:n]``, in whole pages (>= 1 page: the
        first page is the child's dict key). Binary search over pages, comparing slices in C."""
        P = self.page_size
        lo, hi = 1, min(len(key), n - pos) // P
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if key[lo * P : mid * P] == tokens[pos + lo * P : pos + mid * P]:
                lo = mid
            else:
                hi = mid - 1
        return lo * P

    def _split(self, node: TreeNode, m: int) -> TreeNode:
        """Split ``node`` after ``m`` tokens; return the new parent that holds the prefix.

        The new parent inherits the lock count, access time and hits; ``node`` keeps the suffix
        and stays a valid handle (unlocking it later walks up through the new parent).
        """
        P = self.page_size
        k = m // P
        top = TreeNode(node.key[:m], node.pages[:k], node.hashes[:k], node.parent)
        top.lock_ref = node.lock_ref
        top.last_access = node.last_access
        top.hits = node.hits
        node.parent.children[tuple(node.key[:P])] = top
        node.key = node.key[m:]
        node.pages = node.pages[k:]
        node.hashes = node.hashes[k:]
        node.parent = top
        top.children[tuple(node.key[:P])] = node
        return top

    # ------------------------------------------------------------------ locks

    def lock(self, node: TreeNode) -> None:
        while node.parent is not None:
            if node.lock_ref == 0:
                self.protected_tokens += len(node.key)
                self._leaves.discard(node)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: TreeNode) -> None:
        if node.parent is not None and node.lock_ref <= 0:
            raise ValueError(f"unlock of a node that is not locked: {node!r}")
        while node.parent is not None:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.protected_tokens -= len(node.key)
                if not node.children:
                    self._add_leaf(node)
            node = node.parent

    # ------------------------------------------------------------------ eviction

    def _add_leaf(self, node: TreeNode) -> None:
        self._leaves.add(node)
        self._push_seq += 1
        heapq.heappush(self._heap, (self._priority(node), self._push_seq, node))

    def pop_victims(self, num_pages: int) -> list[TreeNode]:
        """Remove unlocked leaves in eviction order until ``num_pages`` pages are gathered (or no
        evictable leaf is left); return the removed nodes. Parents that become unlocked leaves
        join the candidates."""
        victims: list[TreeNode] = []
        got = 0
        heap, leaves, prio = self._heap, self._leaves, self._priority
        while got < num_pages and leaves:
            p, _, node = heapq.heappop(heap)
            if node not in leaves:
                continue  # stale entry: the node was locked, got a child or was evicted
            cur = prio(node)
            if cur != p:
                self._push_seq += 1
                heapq.heappush(heap, (cur, self._push_seq, node))
                continue
            leaves.discard(node)
            self._detach(node)
            victims.append(node)
            got += len(node.pages)
        if len(heap) > 2 * len(leaves) + 64:
            self._rebuild_heap()
        return victims

    def _detach(self, node: TreeNode) -> None:
        parent = node.parent
        del parent.children[tuple(node.key[: self.page_size])]
        self.total_tokens -= len(node.key)
        if parent.parent is not None and not parent.children and parent.lock_ref == 0:
            self._add_leaf(parent)

    def _rebuild_heap(self) -> None:
        self._heap = []
        for node in self._leaves:
            self._push_seq += 1
            self._heap.append((self._priority(node), self._push_seq, node))
        heapq.heapify(self._heap)

    def clear(self) -> None:
        self._roots.clear()
        self.total_tokens = 0
        self.protected_tokens = 0
        self._leaves.clear()
        self._heap.clear()
