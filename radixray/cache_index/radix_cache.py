"""RadixCache: the prefix cache with reuse on (the contract is in ``cache_contract``), with an
optional host tier behind it (``host_tier``, docs/host_tier.md)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .block_hash import check_page_size, hash_blocks
from .cache_contract import MatchResult, PrefixCache
from .events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from .ghost import GhostList
from .host_tier import HOST, HostTier, PageCopy
from .page_allocator import PageAllocator
from .radix_tree import RadixTree, TreeNode
from .tree_integrity import check_tree

__all__ = ["DEFAULT_GHOST_CAPACITY", "RadixCache"]

# Ghost entries are 8-byte hashes (~100 bytes each in an OrderedDict): 64k of them cost ~6 MB
# and remember about a million tokens at page size 16.
DEFAULT_GHOST_CAPACITY = 65536


class RadixCache(PrefixCache):
    """Prefix reuse over a page-granular radix tree (values are page ids), with lock refs,
    LRU/LFU eviction of unlocked leaves, KV events and a ghost list of evicted blocks. With a
    ``host_allocator`` (host pages of the same page size) device eviction demotes to the host
    tier instead of forgetting, and a match returns the host-resident continuation too.
    ``host_write_through_hits`` = N (None: off, write-back only) also copies a device node to
    the host tier when a lock takes it after its N-th hit, so its later demotion copies
    nothing."""

    def __init__(
        self,
        page_size: int,
        allocator: PageAllocator,
        eviction: str = "lru",
        enable_events: bool = False,
        ghost_capacity: int = DEFAULT_GHOST_CAPACITY,
        medium: str | None = "GPU",
        host_allocator: PageAllocator | None = None,
        host_write_through_hits: int | None = None,
    ):
        self.page_size = check_page_size(page_size)
        self.allocator = allocator
        self.eviction = eviction
        self._tree = RadixTree(page_size, eviction)
        self.enable_events = enable_events
        self.medium = medium
        self._events: list[KVEvent] = []
        self._ghost = GhostList(ghost_capacity)
        self.host: HostTier | None = None
        if host_write_through_hits is not None and (
            isinstance(host_write_through_hits, bool)
            or not isinstance(host_write_through_hits, int)
            or host_write_through_hits < 1
        ):
            raise ValueError(
                f"host_write_through_hits must be None or an int >= 1, "
                f"got {host_write_through_hits!r}"
            )
        self.write_through_hits = host_write_through_hits
        if host_allocator is not None:
            emit = (lambda ev: self._events.append(ev)) if enable_events else None
            self.host = self._host_tier(host_allocator, emit)

    def _host_tier(self, host_allocator: PageAllocator, emit) -> HostTier:
        return HostTier(host_allocator, self._tree, self._ghost, emit)

    @property
    def host_allocator(self) -> PageAllocator | None:
        return self.host.allocator if self.host else None

    # -------------------------------------------------------------- contract

    def match_prefix(self, token_ids: Sequence[int], extra_key: str | None = None) -> MatchResult:
        tokens = token_ids if type(token_ids) is list else list(token_ids)
        pages, node, host, host_node = self._tree.match_tiers(tokens, extra_key)
        P = self.page_size
        return MatchResult(pages, len(pages) * P, node, host, len(host) * P, host_node)

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
        cached, stored = self._tree.insert(tokens, list(pages), hash_fn, extra_key)
        # host-only nodes on the path adopt the caller's pages, then the new leaf: one chain
        self._stored(stored)
        return cached

    def _stored(self, chain: list[TreeNode]) -> None:
        """A chain of nodes that just got device pages (none: nothing to do): its blocks leave
        the ghost list and, with events on, one ``BlockStored`` names them."""
        if not chain:
            return
        self._ghost.discard(chain[-1].hashes)
        if self.enable_events:
            hashes = [h for n in chain for h in n.hashes]
            key = [t for n in chain for t in n.key]
            parent = chain[0].parent.last_hash
            self._events.append(BlockStored(hashes, parent, key, self.page_size, self.medium))

    def lock(self, node: TreeNode) -> None:
        self._tree.lock(node)
        if self.host is not None and self.write_through_hits is not None:
            self.host.write_through(node, self.write_through_hits)

    def unlock(self, node: TreeNode) -> None:
        self._tree.unlock(node)

    def evict(self, num_pages: int) -> int:
        if num_pages <= 0:
            return 0
        freed: list[int] = []
        while len(freed) < num_pages:
            node = self._tree.device_leaves.pop()
            if node is None:
                break
            pages = self.host.demote(node) if self.host else None
            if pages is None:  # no host tier, or no room in it: forget the node
                if self.host:
                    self.host.forget_below(node)
                pages = node.pages
                self._tree.remove(node)
                self._ghost.add(node.hashes)
                if self.enable_events:
                    self._events.append(BlockRemoved(list(node.hashes), self.medium))
            freed += pages
        if freed:
            self.allocator.free(freed)
        return len(freed)

    def load_back(self, m: MatchResult, pages: Sequence[int]) -> MatchResult:
        if self.host is None:
            return super().load_back(m, pages)
        if m.host_node is None or len(pages) != len(m.host_pages):
            raise ValueError(
                f"load_back needs one device page per host page: {len(m.host_pages)} host "
                f"pages, got {len(pages)}"
            )
        self.host.load_back(m.node, m.host_node, list(pages))
        all_pages = list(m.pages) + list(pages)
        return MatchResult(all_pages, len(all_pages) * self.page_size, m.host_node)

    def take_copies(self) -> list[PageCopy]:
        return self.host.take_copies() if self.host else []

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
        nodes = list(self._tree.iter_nodes())
        if self.host:
            self.host.free_all(nodes)
        for node in nodes:
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
    def host_tokens(self) -> int:
        """Tokens with a host copy (host-only nodes and device nodes with a copy)."""
        return self._tree.host_tokens

    @property
    def host_spare_pages(self) -> int:
        """Host pages a demotion can take without losing a prefix (``HostTier.spare_pages``;
        0 without a host tier)."""
        return self.host.spare_pages if self.host else 0

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
        P = self.page_size
        for node in self._tree.iter_nodes():  # parents first, as BlockStored chains require
            for medium, held in ((self.medium, node.pages), (HOST, node.host)):
                if held:
                    parent = node.parent.last_hash
                    events.append(BlockStored(list(node.hashes), parent, list(node.key), P, medium))
        return events

    def cached_pages(self) -> list[int]:
        """Device pages held by the tree."""
        return [p for node in self._tree.iter_nodes() for p in node.pages]

    def cached_host_pages(self) -> list[int]:
        return [p for node in self._tree.iter_nodes() for p in node.host]

    # -------------------------------------------------------------- invariants

    def check_integrity(self, held_pages: Iterable[int] | None = None) -> None:
        check_tree(self._tree, self._ghost, self.allocator, self.host_allocator, held_pages)

    def __repr__(self) -> str:
        return (
            f"RadixCache(page_size={self.page_size}, eviction={self.eviction!r}, "
            f"total_tokens={self.total_tokens}, protected_tokens={self.protected_tokens})"
        )
