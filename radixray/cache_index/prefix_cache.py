"""The worker's prefix caches, chosen by name: RadixCache (reuse on) and ChunkCache (reuse off).

The ownership protocol every cache keeps with its caller is ``PrefixCache``'s, in
``cache_contract``; each implementation has its own module. This module is the registry, and
keeps the names importable from one place.
"""

from __future__ import annotations

from .cache_contract import MatchResult, PrefixCache
from .chunk_cache import ChunkCache
from .mamba_radix_cache import MambaRadixCache
from .page_allocator import PageAllocator
from .radix_cache import RadixCache
from .swa_radix_cache import SWARadixCache

__all__ = [
    "MatchResult",
    "PrefixCache",
    "RadixCache",
    "SWARadixCache",
    "MambaRadixCache",
    "ChunkCache",
    "CACHE_TYPES",
    "make_cache",
]

CACHE_TYPES = {
    "radix": RadixCache,
    "swa_radix": SWARadixCache,
    "mamba_radix": MambaRadixCache,
    "chunk": ChunkCache,
}


def make_cache(kind: str, page_size: int, allocator: PageAllocator, **kwargs) -> PrefixCache:
    """Build a cache by name ("radix", "swa_radix", "mamba_radix" or "chunk"); kwargs go to
    the radix caches only ("swa_radix" needs a ``WindowedAllocator``, "mamba_radix" a
    ``state_allocator``: the state pool's slot ids)."""
    if kind not in CACHE_TYPES:
        raise ValueError(f"cache must be one of {sorted(CACHE_TYPES)}, got {kind!r}")
    if kind == "chunk":
        return ChunkCache(page_size, allocator)
    return CACHE_TYPES[kind](page_size, allocator, **kwargs)
