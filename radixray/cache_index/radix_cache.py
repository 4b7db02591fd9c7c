"""RadixCache: the prefix cache with reuse on (the contract is in ``cache_contract``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .block_hash import check_page_size, hash_blocks
from .cache_contract import MatchResult, PrefixCache, check_free_and_held
from .events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from .ghost import GhostList
from .page_allocator import PageAllocator
from .radix_tree import RadixTree, TreeNode

__all__ = ["DEFAULT_GHOST_CAPACITY", "RadixCache"]

# Ghost entries are 8-byte hashes (~100 bytes each in an OrderedDict): 64k of them cost ~6 MB
# and remember about a million tokens at page size 16.
DEFAULT_GHOST_CAPACITY = 65536


class RadixCache(PrefixCache):
    """Prefix reuse over a page-granular radix tree (values are page ids), with lock refs,
    LRU/LFU eviction of unlocked leaves, KV events and a ghost list of evicted blocks."""

    def __init__(
        self,
        page_size: int,
        allocator: PageAllocator,
        eviction: str = "lru",
        enable_events: bool = False,
        ghost_capacity: int = DEFAULT_GHOST_CAPACITY,
        medium: str | None = "GPU",
    ):
        self.page_size = check_page_size(page_size)
        self.allocator = allocator
        self.eviction = eviction
        self._tree = RadixTree(page_size, eviction)
        self.enable_events = enable_events
        self.medium = medium
        self._events: list[KVEvent] = []
        self._ghost = GhostList(ghost_capacity)

    # -------------------------------------------------------------- contract

    def match_prefix(self, token_ids: Sequence[int], extra_key: str | None = None) -> MatchResult:
        tokens = token_ids if type(token_ids) is list else list(token_ids)
        pages, node = self._tree.match(tokens, extra_key)
        return MatchResult(pages, len(pages) * self.page_size, node)

    def peek_prefix(
        self, token_ids: list[int], block_hashes: Sequence[int], extra_key: str | None = None
    ) -> int:
        return self._tree.peek(token_ids, block_hashes, extra_key)

    def insert(
        self,
        token_ids: Sequence[int],
        pages: Sequence[int],
        extra_key: str | None = None,
        block_hashes: Sequence[int] | None = None,
    ) -> int:
        P = self.page_size
        n_full = len(token_ids) // P
        if len(pages) < n_full:
            raise ValueError(
                f"pages must cover every full page of token_ids: {len(token_ids)} tokens at "
                f"page_size {P} need {n_full} pages, got {len(pages)}"
            )

        def hash_fn(first: int, key: list[int], parent: int | None) -> list[int]:
            known = list(block_hashes[first : first + len(key) // P]) if block_hashes else []
            if len(known) * P == len(key):
                return known
            if known:
                parent = known[-1]
            return known + hash_blocks(key[len(known) * P :], P, parent=parent, extra_key=extra_key)

        tokens = token_ids if type(token_ids) is list else list(token_ids)
        cached, leaf = self._tree.insert(tokens, list(pages), hash_fn, extra_key)
        if leaf is not None:
            self._ghost.discard(leaf.hashes)
            if self.enable_events:
                parent_hash = leaf.parent.last_hash
                self._events.append(
                    BlockStored(list(leaf.hashes), parent_hash, list(leaf.key), P, self.medium)
                )
        return cached

    def lock(self, node: TreeNode) -> None:
        self._tree.lock(node)

    def unlock(self, node: TreeNode) -> None:
        self._tree.unlock(node)

    def evict(self, num_pages: int) -> int:
        if num_pages <= 0:
            return 0
        victims = self._tree.pop_victims(num_pages)
        if not victims:
            return 0
        freed: list[int] = []
        for node in victims:
            freed += node.pages
            self._ghost.add(node.hashes)
            if self.enable_events:
                self._events.append(BlockRemoved(list(node.hashes), self.medium))
        self.allocator.free(freed)
        return len(freed)

    def was_evicted(self, block_hashes: Sequence[int]) -> int:
        return self._ghost.leading_hits(block_hashes)

    def take_events(self) -> list[KVEvent]:
        events, self._events = self._events, []
        return events

    def reset(self) -> None:
        if self._tree.protected_tokens:
            raise RuntimeError(
                f"cannot reset the cache while {self._tree.protected_tokens} tokens are locked"
            )
        pages: list[int] = []
        for node in self._tree.iter_nodes():
            pages += node.pages
            # A reset is a deliberate eviction of everything: later misses on these blocks are
            # "evicted", not "cold".
            self._ghost.add(node.hashes)
        self._tree.clear()
        self.allocator.free(pages)
        if self.enable_events:
            self._events.append(AllBlocksCleared())

    @property
    def total_tokens(self) -> int:
        return self._tree.total_tokens

    @property
    def evictable_tokens(self) -> int:
        return self._tree.evictable_tokens

    @property
    def protected_tokens(self) -> int:
        return self._tree.protected_tokens

    @property
    def total_pages(self) -> int:
        return self._tree.total_tokens // self.page_size

    @property
    def evictable_pages(self) -> int:
        return self._tree.evictable_tokens // self.page_size

    def all_block_hashes(self) -> list[int]:
        return [h for node in self._tree.iter_nodes() for h in node.hashes]

    def snapshot_events(self) -> list[KVEvent]:
        events: list[KVEvent] = [AllBlocksCleared()]
        for node in self._tree.iter_nodes():  # parents first, as BlockStored chains require
            events.append(
                BlockStored(
                    list(node.hashes),
                    node.parent.last_hash,
                    list(node.key),
                    self.page_size,
                    self.medium,
                )
            )
        return events

    def cached_pages(self) -> list[int]:
        return [p for node in self._tree.iter_nodes() for p in node.pages]

    # -------------------------------------------------------------- invariants

    def check_integrity(self, held_pages: Iterable[int] | None = None) -> None:
        tree, P = self._tree, self.page_size
        total = protected = 0
        leaves = set()
        cached: list[int] = []
        for extra_key, root in tree.roots().items():
            if root.key or root.pages or root.parent is not None:
                raise AssertionError(f"root of namespace {extra_key!r} is not empty")
            stack = [root]
            while stack:
                node = stack.pop()
                child_locks = 0
                for first, child in node.children.items():
                    self._check_node(child, node, first)
                    child_locks += child.lock_ref
                    stack.append(child)
                if node.parent is None:
                    continue
                if node.lock_ref < child_locks:
                    raise AssertionError(
                        f"lock_ref {node.lock_ref} < children's {child_locks} at {node!r}"
                    )
                total += len(node.key)
                cached += node.pages
                if node.lock_ref:
                    protected += len(node.key)
                elif not node.children:
                    leaves.add(node)
        if total != tree.total_tokens:
            raise AssertionError(f"total_tokens {tree.total_tokens} != counted {total}")
        if protected != tree.protected_tokens:
            raise AssertionError(f"protected_tokens {tree.protected_tokens} != counted {protected}")
        if leaves != tree.evictable_leaves:
            raise AssertionError(
                f"evictable leaf set has {len(tree.evictable_leaves)} nodes, counted {len(leaves)}"
            )
        if len(cached) * P != total:
            raise AssertionError("cached pages do not match cached tokens")
        if len(self._ghost) > self._ghost.capacity:
            raise AssertionError("ghost list over capacity")
        check_free_and_held(self.allocator, cached, held_pages)

    def _check_node(self, node: TreeNode, parent: TreeNode, first: tuple) -> None:
        P = self.page_size
        if node.parent is not parent:
            raise AssertionError(f"{node!r} has the wrong parent")
        if not node.key or len(node.key) % P:
            raise AssertionError(f"{node!r} key length {len(node.key)} is not a page multiple")
        if tuple(node.key[:P]) != first:
            raise AssertionError(f"{node!r} is filed under the wrong first page")
        if len(node.pages) != len(node.key) // P or len(node.hashes) != len(node.pages):
            raise AssertionError(
                f"{node!r} has {len(node.pages)} pages, {len(node.hashes)} "
                f"hashes for {len(node.key)} tokens"
            )
        if node.lock_ref < 0:
            raise AssertionError(f"{node!r} has a negative lock_ref")

    def __repr__(self) -> str:
        return (
            f"RadixCache(page_size={self.page_size}, eviction={self.eviction!r}, "
            f"total_tokens={self.total_tokens}, protected_tokens={self.protected_tokens})"
        )
