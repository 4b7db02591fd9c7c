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

Tiers (docs/host_tier.md): a node holds device pages (``pages``), host pages (``host``) or both,
each list empty or one id per page. Device residency is closed under ancestors, so a path is
device-resident nodes then host-only nodes: a match is a device prefix and a host continuation.
``total_tokens``/``protected_tokens`` count device-resident tokens, ``host_tokens`` host copies.
``LeafHeap``s in eviction order: ``device_leaves`` (device pages, unlocked, no child with device
pages), ``host_leaves`` (host pages only, unlocked, childless) and ``host_copies`` (unlocked, in
both tiers: a host copy the host tier can drop losing nothing). Without a host tier every node
is device-resident and the device leaves are the unlocked childless nodes.

This module knows nothing of allocators or events: ``radix_cache.RadixCache`` owns those.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from .leaf_heap import LeafHeap

__all__ = ["TreeNode", "RadixTree", "EVICTION_POLICIES"]

# The heap key of a node per eviction policy, smallest first: lru, or lfu (then lru).
EVICTION_POLICIES: dict[str, Callable[[TreeNode], object]] = {
    "lru": lambda n: n.last_access,
    "lfu": lambda n: (n.hits, n.last_access),
}


class TreeNode:
    __slots__ = (
        *("key", "pages", "host", "hashes", "children", "parent"),
        *("lock_ref", "last_access", "hits", "device_children"),
    )

    def __init__(
        self,
        key: list[int] | None = None,
        pages: list[int] | None = None,
        hashes: list[int] | None = None,
        parent: TreeNode | None = None,
    ):
        self.key: list[int] = key if key is not None else []
        self.pages: list[int] = pages if pages is not None else []  # device pages, or []
        self.host: list[int] = []  # host pages, or []
        self.hashes: list[int] = hashes if hashes is not None else []
        self.children: dict[tuple[int, ...], TreeNode] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = 0
        self.hits = 0
        self.device_children = 0  # children with device pages

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def last_hash(self) -> int | None:
        """The hash of this node's last page (None for a root)."""
        return self.hashes[-1] if self.hashes else None

    def __repr__(self) -> str:
        return (
            f"TreeNode(tokens={len(self.key)}, pages={self.pages}, host={self.host}, "
            f"lock_ref={self.lock_ref}, children={len(self.children)})"
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
        self.total_tokens = 0  # device-resident
        self.protected_tokens = 0  # device-resident and locked
        self.host_tokens = 0  # with a host copy
        self.device_leaves = LeafHeap(self._priority)
        self.host_leaves = LeafHeap(self._priority)
        self.host_copies = LeafHeap(self._priority)
        self._heaps = (self.device_leaves, self.host_leaves, self.host_copies)

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
        return self.device_leaves.members

    # ------------------------------------------------------------------ match / insert

    def match(self, tokens: list[int], extra_key: str | None = None) -> tuple[list, TreeNode]:
        return self.match_tiers(tokens, extra_key)[:2]  # the device-resident part

    def match_tiers(
        self, tokens: list[int], extra_key: str | None = None
    ) -> tuple[list, TreeNode, list, TreeNode | None]:
        """Longest page-aligned cached prefix of ``tokens``: (device pages, last device-resident
        node, host pages of the host-only continuation, its last node or None).

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
            return [], self.root(extra_key), [], None
        self._clock += 1
        now = self._clock
        pages: list[int] = []
        host: list[int] = []
        host_node = None
        cur = node
        pos = 0
        while pos < n:
            child = cur.children.get(tuple(tokens[pos : pos + P]))
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
            if child.pages:  # device-resident nodes come first on any path
                pages += child.pages
                node = child
            else:
                host += child.host
                host_node = child
            pos += klen
            cur = child
        return pages, node, host, host_node

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
    ) -> tuple[int, list[TreeNode]]:
        """Insert the page-aligned part of ``tokens`` with ``pages[i]`` holding page ``i``.

        Returns (tokens already device-cached, the nodes that got device pages: host-only nodes
        on the path, which adopt the caller's pages, then the new leaf if any, in path order).
        Pages of the device-cached part are not adopted: the tree keeps its own.
        ``hash_fn(first_page, key, parent_hash)`` gives the hashes of a new node's pages (``key``
        starts at page ``first_page`` of ``tokens``).
        """
        if type(tokens) is not list:  # a tuple slice never equals a list key
            tokens = list(tokens)
        P = self.page_size
        n = len(tokens) - len(tokens) % P
        node = self.root(extra_key)
        self._clock += 1
        now = self._clock
        pos = 0
        cached = None  # where the first host-only node starts
        stored: list[TreeNode] = []
        while pos < n:
            child = node.children.get(tuple(tokens[pos : pos + P]))
            if child is None:
                break
            klen = len(child.key)
            if pos + klen > n or tokens[pos : pos + klen] != child.key:
                klen = self._common_len(child.key, tokens, pos, n)
                child = self._split(child, klen)
            child.last_access = now
            if not child.pages:
                cached = pos if cached is None else cached
                self.set_device(child, list(pages[pos // P : (pos + klen) // P]))
                stored.append(child)
            pos += klen
            node = child
        cached = pos if cached is None else cached
        if pos >= n:
            return cached, stored
        key = tokens[pos:n]
        hashes = hash_fn(pos // P, key, node.last_hash)
        leaf = TreeNode(key, list(pages[pos // P : n // P]), hashes, node)
        leaf.last_access = now
        node.children[tuple(key[:P])] = leaf
        node.device_children += 1
        self.total_tokens += len(key)
        self._refresh(node)  # it has a child now
        self._refresh(leaf)
        return cached, stored + [leaf]

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
        top.host = node.host[:k]
        top.device_children = 1 if node.pages else 0
        top.lock_ref = node.lock_ref
        top.last_access = node.last_access
        top.hits = node.hits
        node.parent.children[tuple(node.key[:P])] = top
        node.key = node.key[m:]
        node.pages = node.pages[k:]
        node.host = node.host[k:]
        node.hashes = node.hashes[k:]
        node.parent = top
        top.children[tuple(node.key[:P])] = node
        self._refresh(top)  # in both tiers, unlocked: a host copy to drop
        return top

    # ------------------------------------------------------------------ locks

    def lock(self, node: TreeNode) -> None:
        while node.parent is not None:
            if node.lock_ref == 0:
                if node.pages:
                    self.protected_tokens += len(node.key)
                for heap in self._heaps:
                    heap.discard(node)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: TreeNode) -> None:
        if node.parent is not None and node.lock_ref <= 0:
            raise ValueError(f"unlock of a node that is not locked: {node!r}")
        while node.parent is not None:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                if node.pages:
                    self.protected_tokens -= len(node.key)
                self._refresh(node)
            node = node.parent

    # ------------------------------------------------------------------ residency

    def _refresh(self, node: TreeNode) -> None:
        """Put ``node`` in or out of each tier's evictable leaves after a change."""
        if node.parent is None:
            return
        free = node.lock_ref == 0
        self.device_leaves.set_member(node, free and bool(node.pages) and not node.device_children)
        self.host_leaves.set_member(node, free and not node.pages and not node.children)
        self.host_copies.set_member(node, free and bool(node.pages) and bool(node.host))

    def set_device(self, node: TreeNode, pages: list[int]) -> None:
        """A host-only node gets device pages (a load-back, or a caller's pages on insert)."""
        node.pages = pages
        self.total_tokens += len(node.key)
        if node.lock_ref:
            self.protected_tokens += len(node.key)
        node.parent.device_children += 1
        self._refresh(node)
        self._refresh(node.parent)

    def drop_device(self, node: TreeNode) -> list[int]:
        """Take a node's device pages away (it keeps its host copy); return them."""
        pages, node.pages = node.pages, []
        self.total_tokens -= len(node.key)
        if node.lock_ref:
            self.protected_tokens -= len(node.key)
        node.parent.device_children -= 1
        self._refresh(node)
        self._refresh(node.parent)
        return pages

    def set_host(self, node: TreeNode, host: list[int]) -> None:
        """Give ``node`` host pages, or take them (``[]``; the caller frees them)."""
        self.host_tokens += (bool(host) - bool(node.host)) * len(node.key)
        node.host = host
        self._refresh(node)

    def remove(self, node: TreeNode) -> None:
        """Take a childless node out of the tree (its pages are the caller's to free)."""
        if node.children:
            raise ValueError(f"remove of a node with children: {node!r}")
        parent = node.parent
        del parent.children[tuple(node.key[: self.page_size])]
        if node.pages:
            self.total_tokens -= len(node.key)
            if node.lock_ref:
                self.protected_tokens -= len(node.key)
            parent.device_children -= 1
        if node.host:
            self.host_tokens -= len(node.key)
        for heap in self._heaps:
            heap.discard(node)
        self._refresh(parent)

    def clear(self) -> None:
        self._roots.clear()
        self.total_tokens = 0
        self.protected_tokens = 0
        self.host_tokens = 0
        for heap in self._heaps:
            heap.clear()
