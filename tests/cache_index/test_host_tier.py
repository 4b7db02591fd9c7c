"""The host tier behind RadixCache, case by case: demote, load-back, both evictions, events."""

from __future__ import annotations

from radixray.cache_index import BlockRemoved, BlockStored, PageAllocator, RadixCache, hash_blocks

from .helpers import put


def tiered(P=2, device=4, host=4):
    alloc, host_alloc = PageAllocator(device), PageAllocator(host)
    cache = RadixCache(P, alloc, enable_events=True, host_allocator=host_alloc)
    return cache, alloc, host_alloc


def test_device_eviction_demotes_and_match_returns_the_host_continuation():
    cache, alloc, host_alloc = tiered()
    a = [1, 2, 3, 4]
    assert put(cache, alloc, a) == [0, 1]
    cache.take_events()
    assert cache.evict(2) == 2
    assert alloc.num_free == 4 and host_alloc.num_free == 2
    (copy,) = cache.take_copies()
    assert copy.to_host and copy.src == [0, 1] and copy.dst == [0, 1]
    h = hash_blocks(a, 2)
    # the host store comes before the device remove
    assert cache.take_events() == [BlockStored(h, None, a, 2, "CPU"), BlockRemoved(h, "GPU")]
    m = cache.match_prefix(a + [9])
    assert (m.pages, m.num_tokens, list(m.host_pages), m.host_tokens) == ([], 0, [0, 1], 4)
    assert m.node.is_root and m.host_node is not None
    assert cache.was_evicted(h) == 0  # demoted, not evicted
    cache.check_integrity(held_pages=[])


def test_load_back_keeps_the_host_copy_and_a_second_demotion_copies_nothing():
    cache, alloc, host_alloc = tiered()
    a = [1, 2, 3, 4]
    put(cache, alloc, a)
    cache.evict(2)
    cache.take_copies(), cache.take_events()
    m = cache.match_prefix(a + [9])
    cache.lock(m.host_node)
    pages = alloc.alloc(2)
    m2 = cache.load_back(m, pages)
    assert (m2.pages, m2.num_tokens, m2.node) == (pages, 4, m.host_node)
    (copy,) = cache.take_copies()
    assert not copy.to_host and copy.src == [0, 1] and copy.dst == pages
    h = hash_blocks(a, 2)
    assert cache.take_events() == [BlockStored(h, None, a, 2, "GPU")]  # no host remove
    assert cache.host_tokens == 4 and cache.total_tokens == 4
    cache.check_integrity(held_pages=[])
    cache.unlock(m2.node)
    assert cache.evict(2) == 2
    assert cache.take_copies() == []  # the host copy is kept: nothing to copy
    assert cache.take_events() == [BlockRemoved(h, "GPU")]
    cache.check_integrity(held_pages=[])


def test_host_tier_evicts_its_lru_host_only_leaves_to_make_room():
    cache, alloc, host_alloc = tiered(device=4, host=2)
    a, b = [1, 2, 3, 4], [5, 6, 7, 8]
    put(cache, alloc, a)
    cache.evict(2)  # a -> host (fills it)
    put(cache, alloc, b)
    cache.take_events(), cache.take_copies()
    cache.evict(2)  # b -> host; a is forgotten to make room
    ha, hb = hash_blocks(a, 2), hash_blocks(b, 2)
    assert cache.take_events() == [
        BlockRemoved(ha, "CPU"),
        BlockStored(hb, None, b, 2, "CPU"),
        BlockRemoved(hb, "GPU"),
    ]
    assert cache.was_evicted(ha) == 2 and cache.was_evicted(hb) == 0
    assert cache.match_prefix(a + [0]).host_tokens == 0
    assert cache.match_prefix(b + [0]).host_tokens == 4
    cache.check_integrity(held_pages=[])


def test_no_room_on_the_host_forgets_as_before():
    cache, alloc, host_alloc = tiered(device=4, host=1)
    a = [1, 2, 3, 4]
    put(cache, alloc, a)
    cache.take_events()
    assert cache.evict(1) == 2  # the node needs 2 host pages; the host holds 1
    assert cache.take_copies() == []
    assert cache.take_events() == [BlockRemoved(hash_blocks(a, 2), "GPU")]
    assert cache.total_tokens == 0 and cache.host_tokens == 0
    cache.check_integrity(held_pages=[])


def test_insert_adopts_the_callers_pages_for_host_only_nodes():
    cache, alloc, host_alloc = tiered(device=6, host=4)
    a = [1, 2, 3, 4]
    put(cache, alloc, a)
    cache.evict(2)
    cache.take_events(), cache.take_copies()
    pages = alloc.alloc(3)
    assert cache.insert(a + [5, 6], pages) == 0  # nothing was device-cached
    h = hash_blocks(a + [5, 6], 2)
    assert cache.take_events() == [BlockStored(h, None, a + [5, 6], 2, "GPU")]
    assert cache.take_copies() == []
    m = cache.match_prefix(a + [5, 6, 7])
    assert m.pages == pages and m.host_tokens == 0
    assert cache.host_tokens == 4  # the old host copy stays
    cache.check_integrity(held_pages=[])


def test_locked_host_continuation_survives_host_pressure():
    cache, alloc, host_alloc = tiered(device=4, host=2)
    a, b = [1, 2, 3, 4], [5, 6, 7, 8]
    put(cache, alloc, a)
    cache.evict(2)
    m = cache.match_prefix(a + [0])
    cache.lock(m.host_node)
    put(cache, alloc, b)
    cache.evict(2)  # b has no room on the host (a is locked): b is forgotten
    assert cache.match_prefix(a + [0]).host_tokens == 4
    assert cache.match_prefix(b + [0]).host_tokens == 0
    cache.unlock(m.host_node)
    cache.check_integrity(held_pages=[])


def test_snapshot_and_reset_cover_both_tiers():
    cache, alloc, host_alloc = tiered()
    a = [1, 2, 3, 4]
    put(cache, alloc, a)
    cache.evict(2)
    put(cache, alloc, [9, 9])
    media = [(ev.medium, len(ev.block_hashes)) for ev in cache.snapshot_events()[1:]]
    assert sorted(media) == [("CPU", 2), ("GPU", 1)]
    cache.reset()
    assert host_alloc.num_free == 4 and alloc.num_free == 4
    cache.check_integrity(held_pages=[])
