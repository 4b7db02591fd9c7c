from radixray.cache_index import GhostList, hash_blocks

from .helpers import make_cache, put


def test_ghost_list_bounds_and_leading_hits():
    g = GhostList(3)
    g.add([1, 2, 3])
    assert len(g) == 3 and g.leading_hits([1, 2, 3, 4]) == 3
    g.add([4])  # the oldest (1) goes
    assert len(g) == 3 and 1 not in g and 4 in g
    assert g.leading_hits([1, 2]) == 0  # leading blocks only
    assert g.leading_hits([2, 3, 9, 4]) == 2
    g.add([2])  # refreshed: 3 is now the oldest
    g.add([5])
    assert 3 not in g and 2 in g
    g.discard([2, 77])
    assert 2 not in g and len(g) == 2
    g.clear()
    assert len(g) == 0


def test_zero_capacity_remembers_nothing():
    g = GhostList(0)
    g.add([1, 2])
    assert len(g) == 0 and g.leading_hits([1]) == 0


def test_was_evicted_counts_leading_evicted_blocks():
    cache, alloc = make_cache(4)
    a = list(range(12))  # 3 pages
    b = list(range(8)) + [90, 91, 92, 93]  # shares 2 pages with a
    put(cache, alloc, a)
    put(cache, alloc, b)
    ha, hb = hash_blocks(a, 4), hash_blocks(b, 4)
    assert cache.was_evicted(ha) == 0
    # Touch b so a's last page is the oldest leaf, then evict just that page.
    cache.match_prefix(b)
    assert cache.evict(1) == 1
    assert cache.match_prefix(a).num_tokens == 8
    # Only a's third block is gone; the first two are still cached, so they are not "evicted".
    assert cache.was_evicted(ha) == 0
    assert cache.was_evicted(ha[2:]) == 1
    assert cache.was_evicted(hb[2:]) == 0
    cache.evict(100)
    assert cache.was_evicted(ha) == 3
    assert cache.was_evicted(hb) == 3
    assert cache.was_evicted([12345] + ha) == 0  # leading blocks only
    cache.check_integrity()


def test_reinsert_removes_from_ghost():
    cache, alloc = make_cache(4)
    a = list(range(12))
    put(cache, alloc, a)
    cache.evict(3)
    h = hash_blocks(a, 4)
    assert cache.was_evicted(h) == 3
    put(cache, alloc, a[:8])  # the first two blocks come back
    assert cache.was_evicted(h) == 0
    assert cache.was_evicted(h[2:]) == 1
    put(cache, alloc, a)
    assert cache.was_evicted(h[2:]) == 0
    cache.check_integrity()


def test_reset_counts_as_eviction():
    cache, alloc = make_cache(4)
    a = list(range(8))
    put(cache, alloc, a)
    cache.reset()
    assert cache.was_evicted(hash_blocks(a, 4)) == 2


def test_ghost_capacity_bound_keeps_the_most_recent():
    cache, alloc = make_cache(2, num_pages=32, ghost_capacity=4)
    seqs = [[i, i, i, i] for i in range(1, 4)]  # 3 sequences x 2 pages
    for s in seqs:
        put(cache, alloc, s)
    for _ in seqs:  # evict in insertion order (LRU): 6 ghost blocks, capacity 4
        assert cache.evict(2) == 2
    assert len(cache._ghost) == 4
    assert cache.was_evicted(hash_blocks(seqs[0], 2)) == 0  # the oldest were dropped
    assert cache.was_evicted(hash_blocks(seqs[1], 2)) == 2
    assert cache.was_evicted(hash_blocks(seqs[2], 2)) == 2
    cache.check_integrity()
