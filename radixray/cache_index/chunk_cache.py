"""ChunkCache: the prefix cache with reuse off (the contract is in ``cache_contract``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .block_hash import check_page_size
from .cache_contract import MatchResult, PrefixCache, check_free_and_held
from .events import KVEvent
from .page_allocator import PageAllocator
from .radix_tree import TreeNode

__all__ = ["ChunkCache"]


class ChunkCache(PrefixCache):
    """Reuse off: matches nothing, caches nothing. ``insert`` frees the full pages it is given
    (the request is finished with them), so the caller's protocol is the same as for RadixCache.
    Misses against it are attributed to ``disabled``."""

    def __init__(self, page_size: int, allocator: PageAllocator):
        self.page_size = check_page_size(page_size)
        self.allocator = allocator
        self._root = TreeNode()

    def match_prefix(self, token_ids: Sequence[int], extra_key: str | None = None) -> MatchResult:
        return MatchResult([], 0, self._root)

    def peek_prefix(
        self, token_ids: list[int], block_hashes: Sequence[int], extra_key: str | None = None
    ) -> int:
        return 0

    def insert(
        self,
        token_ids: Sequence[int],
        pages: Sequence[int],
        extra_key: str | None = None,
        block_hashes: Sequence[int] | None = None,
    ) -> int:
        n_full = len(token_ids) // self.page_size
        if len(pages) < n_full:
            raise ValueError(
                f"pages must cover every full page of token_ids: need {n_full}, got {len(pages)}"
            )
        self.allocator.free(pages[:n_full])
        return 0

    def lock(self, node: TreeNode) -> None:
        pass

    def unlock(self, node: TreeNode) -> None:
        pass

    def evict(self, num_pages: int) -> int:
        return 0

    def was_evicted(self, block_hashes: Sequence[int]) -> int:
        return 0

    def take_events(self) -> list[KVEvent]:
        return []

    def check_integrity(self, held_pages: Iterable[int] | None = None) -> None:
        check_free_and_held(self.allocator, [], held_pages)

    def reset(self) -> None:
        pass

    @property
    def total_tokens(self) -> int:
        return 0

    @property
    def evictable_tokens(self) -> int:
        return 0

    @property
    def protected_tokens(self) -> int:
        return 0
