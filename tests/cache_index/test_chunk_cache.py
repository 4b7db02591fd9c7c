from radixray.cache_index import ChunkCache, PageAllocator, hash_blocks, make_cache


def test_chunk_cache_matches_nothing_and_frees_on_insert():
    alloc = PageAllocator(8)
    cache = make_cache("chunk", 4, alloc)
    assert isinstance(cache, ChunkCache)
    toks = list(range(10))
    pages = alloc.alloc(3)
    assert cache.insert(toks, pages) == 0
    # The full pages went back to the allocator; the partial tail stays with the caller.
    assert alloc.num_free == 7 and not alloc.is_free(pages[2])
    cache.check_integrity(held_pages=pages[2:])
    alloc.free(pages[2:])
    r = cache.match_prefix(toks)
    assert (r.pages, r.num_tokens) == ([], 0)
    cache.lock(r.node)
    assert cache.protected_tokens == 0
    cache.unlock(r.node)
    assert cache.evict(5) == 0
    assert (cache.total_tokens, cache.evictable_tokens, cache.protected_tokens) == (0, 0, 0)
    assert cache.was_evicted([1, 2, 3]) == 0
    assert cache.take_events() == [] and cache.all_block_hashes() == []
    cache.reset()
    cache.check_integrity(held_pages=[])
    assert alloc.num_free == 8


def test_chunk_cache_peeks_nothing():
    cache = ChunkCache(4, PageAllocator(8))
    tokens = list(range(12))
    assert cache.peek_prefix(tokens, hash_blocks(tokens, 4)) == 0
