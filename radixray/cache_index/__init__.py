"""Data structures shared by router and worker. Pure Python: never imports torch."""

from .approx_index import ApproxIndex
from .block_hash import hash_blocks
from .events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVEvent,
    decode_events,
    encode_events,
)
from .ghost import GhostList
from .page_allocator import PageAllocator
from .prefix_cache import ChunkCache, MatchResult, PrefixCache, RadixCache, make_cache
from .radix_tree import RadixTree, TreeNode

__all__ = [
    "AllBlocksCleared",
    "ApproxIndex",
    "BlockRemoved",
    "BlockStored",
    "ChunkCache",
    "EventBatch",
    "GhostList",
    "KVEvent",
    "MatchResult",
    "PageAllocator",
    "PrefixCache",
    "RadixCache",
    "RadixTree",
    "TreeNode",
    "decode_events",
    "encode_events",
    "hash_blocks",
    "make_cache",
]
