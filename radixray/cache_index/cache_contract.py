"""What the scheduler needs from a prefix cache: ``PrefixCache`` and its ``MatchResult``.

Ownership protocol between a cache and its caller (the scheduler):

1. ``match_prefix(tokens)`` returns the cached pages of the longest page-aligned prefix and a node
   handle. The pages are only safe to use while the handle is locked: ``lock(node)`` right away,
   ``unlock(node)`` when done.
2. The caller allocates private pages for the rest and computes them.
3. ``insert(tokens, pages)`` hands the full pages to the cache and returns how many leading tokens
   were already cached. The cache adopts ``pages[cached // P : len(tokens) // P]``. Of the range
   before that, pages the caller got from ``match_prefix`` belong to the cache; any others are
   private duplicates (computed in parallel by another request) that the caller frees. A trailing
   partial page always stays with the caller.

Page accounting: at every moment a page is exactly one of free (in the allocator), in the cache,
or private to one caller. ``check_integrity(held_pages)`` proves it.

With a host tier (``RadixCache(host_allocator=...)``, docs/host_tier.md) a match also returns the
host-resident continuation of the device prefix (``host_pages``, ending at ``host_node``). To use
it the caller locks ``host_node`` (which protects the whole path in both tiers), takes device
pages for it and calls ``load_back``; the cache records the copies, which the caller drains with
``take_copies()`` and runs, in order, before its next forward. Every host page is free or in the
cache.

The implementations: ``radix_cache.RadixCache`` (reuse on), ``swa_radix_cache.SWARadixCache``
(window layers), ``mamba_radix_cache.MambaRadixCache`` (state layers: a match also names a state
checkpoint, which the caller copies before its first forward) and ``chunk_cache.ChunkCache``
(reuse off); ``prefix_cache.make_cache`` picks one by name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from .events import AllBlocksCleared, KVEvent
from .page_allocator import PageAllocator
from .radix_tree import TreeNode

__all__ = ["MatchResult", "PrefixCache", "check_free_and_held"]


class MatchResult(NamedTuple):
    pages: list[int]  # cached (device) page ids of the matched prefix, in order
    num_tokens: int  # == len(pages) * page_size
    node: TreeNode  # handle to lock/unlock; a root when nothing matched
    # The host-resident continuation of that prefix (a host tier only): its host page ids, its
    # tokens (len(host_pages) * page_size) and its last node (the handle to lock to load it).
    host_pages: Sequence[int] = ()
    host_tokens: int = 0
    host_node: TreeNode | None = None
    # Tokens after ``num_tokens`` that are cached but not reusable: their window was dropped
    # (``swa_radix_cache``); attributed to the miss cause "window".
    window_tokens: int = 0
    # A cache of state checkpoints (``mamba_radix_cache``): the state-pool slot holding the state
    # after ``num_tokens`` tokens (None when nothing matched), and the tokens after it whose KV
    # is cached but with no checkpoint at or after them (attributed to the miss cause "state").
    state_slot: int | None = None
    state_tokens: int = 0
    # True: ``state_slot`` is a slot of the host state pool (a checkpoint demoted with its node,
    # ``mamba_host``), copied from there into the request's device slot
    state_host: bool = False


class PrefixCache(ABC):
    """What the scheduler needs from a prefix cache. Page ids are ints; nothing here is a tensor."""

    page_size: int
    allocator: PageAllocator

    @abstractmethod
    def match_prefix(self, token_ids: Sequence[int], extra_key: str | None = None) -> MatchResult:
        """Longest cached page-aligned prefix. Does not change what is cached (it may split a
        node and it updates access times). The pages are safe only while ``node`` is locked."""

    @abstractmethod
    def peek_prefix(
        self, token_ids: list[int], block_hashes: Sequence[int], extra_key: str | None = None
    ) -> int:
        """Tokens ``match_prefix`` would find among the first ``len(block_hashes)`` pages, from
        the pages' chained hashes, without changing anything (no split, no access time). Cheap
        (O(edges)); for estimates such as admission order."""

    @abstractmethod
    def insert(
        self,
        token_ids: Sequence[int],
        pages: Sequence[int],
        extra_key: str | None = None,
        block_hashes: Sequence[int] | None = None,
    ) -> int:
        """Give the full pages of ``token_ids`` to the cache; return the tokens already cached
        (see the module docstring for who frees what). ``block_hashes``, if given, are
        ``hash_blocks(token_ids, page_size, extra_key=extra_key)`` for some leading pages (the
        engine has them from the request's arrival): those pages are not hashed again."""

    @abstractmethod
    def lock(self, node: TreeNode) -> None:
        """Protect ``node`` and its ancestors from eviction (counted: call unlock as often)."""

    @abstractmethod
    def unlock(self, node: TreeNode) -> None:
        """Undo one ``lock``. Raises ValueError if the node is not locked."""

    @abstractmethod
    def evict(self, num_pages: int) -> int:
        """Free at least ``min(num_pages, evictable_tokens // page_size)`` pages of unlocked
        leaves back to the allocator (whole leaves: it may overshoot by less than one leaf).
        Returns the pages freed."""

    @abstractmethod
    def was_evicted(self, block_hashes: Sequence[int]) -> int:
        """How many leading ``block_hashes`` were cached here once and have been evicted."""

    @abstractmethod
    def take_events(self) -> list[KVEvent]:
        """KV events since the last call (empty when events are disabled)."""

    @abstractmethod
    def check_integrity(self, held_pages: Iterable[int] | None = None) -> None:
        """Raise AssertionError on any broken invariant. With ``held_pages`` (pages private to
        running requests), also prove that free + cached + held is every page, each once."""

    @abstractmethod
    def reset(self) -> None:
        """Drop everything cached (pages go back to the allocator). Raises if anything is locked."""

    @property
    @abstractmethod
    def total_tokens(self) -> int: ...

    @property
    @abstractmethod
    def evictable_tokens(self) -> int: ...

    @property
    @abstractmethod
    def protected_tokens(self) -> int: ...

    def load_back(self, m: MatchResult, pages: Sequence[int]) -> MatchResult:
        """Give ``m``'s host continuation the device ``pages`` (one per host page; the caller
        holds a lock on ``m.host_node``) and record the host -> device copies; return the match
        as it is now (all device-resident, ``node`` = the old ``host_node``)."""
        raise ValueError(f"{type(self).__name__} has no host tier to load from")

    def take_copies(self) -> list:
        """The page copies (``host_tier.PageCopy``) recorded since the last call, in the order
        they must run; the caller runs them before its next forward writes any page."""
        return []

    def all_block_hashes(self) -> list[int]:
        """Every block hash held (for a full snapshot to a router)."""
        return []

    def snapshot_events(self) -> list[KVEvent]:
        """Events that rebuild this cache's block set from nothing: ``AllBlocksCleared`` then
        one ``BlockStored`` per cached chain. A router that lost events applies these."""
        return [AllBlocksCleared()]


def check_free_and_held(
    allocator: PageAllocator, cached: list[int], held_pages: Iterable[int] | None
) -> None:
    """The page-accounting half of ``check_integrity``, shared by every cache: ``cached`` pages
    are distinct and not free; with ``held_pages``, free + cached + held is every page, once."""
    allocator.check_integrity()
    cached_set = set(cached)
    if len(cached_set) != len(cached):
        raise AssertionError("a page is in the cache twice")
    for p in cached:
        if allocator.is_free(p):
            raise AssertionError(f"page {p} is both cached and free")
    if held_pages is None:
        return
    held = list(held_pages)
    held_set = set(held)
    if len(held_set) != len(held):
        raise AssertionError("a page is held by running requests twice")
    for p in held:
        if allocator.is_free(p):
            raise AssertionError(f"page {p} is held by a request and free")
        if p in cached_set:
            raise AssertionError(f"page {p} is held by a request and cached")
    total = allocator.num_free + len(cached) + len(held)
    if total != allocator.num_pages:
        raise AssertionError(
            f"page leak: {allocator.num_free} free + {len(cached)} cached + {len(held)} held "
            f"= {total}, expected {allocator.num_pages}"
        )
