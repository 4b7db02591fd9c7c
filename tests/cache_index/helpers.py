"""Shared bits of the cache_index tests: hypothesis profiles and small builders.

Profiles (pick one with ``RADIXRAY_CACHE_INDEX_PROFILE=cache_index_thorough``):

- ``cache_index`` (default): small example counts so the whole cache_index suite runs in well
  under a minute on a shared 2-core machine.
- ``cache_index_thorough``: 20x the examples, for a local soak before touching the cache.

The profile is applied per test (``@CACHE_SETTINGS``), never loaded globally, so other test
folders keep their own hypothesis settings.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

from radixray.cache_index import PageAllocator, RadixCache

settings.register_profile(
    "cache_index",
    max_examples=25,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.register_profile(
    "cache_index_thorough",
    max_examples=500,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
CACHE_SETTINGS = settings.get_profile(os.environ.get("RADIXRAY_CACHE_INDEX_PROFILE", "cache_index"))


def make_cache(page_size: int, num_pages: int = 64, **kwargs) -> tuple[RadixCache, PageAllocator]:
    alloc = PageAllocator(num_pages)
    return RadixCache(page_size, alloc, **kwargs), alloc


def put(cache: RadixCache, alloc: PageAllocator, tokens, extra_key=None) -> list[int]:
    """Compute ``tokens`` privately and hand them to the cache as a finished request would:
    allocate every page (the partial tail too), insert, free the duplicates and the tail.
    Returns the pages the cache adopted."""
    P = cache.page_size
    n_pages = -(-len(tokens) // P)
    n_full = len(tokens) // P
    pages = alloc.alloc(n_pages)
    assert pages is not None, "test pool too small"
    cached = cache.insert(tokens, pages, extra_key=extra_key)
    alloc.free(pages[: cached // P] + pages[n_full:])
    return pages[cached // P : n_full]
