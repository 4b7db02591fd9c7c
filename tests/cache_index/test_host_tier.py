"""The host tier behind RadixCache, case by case: demote, load-back, both evictions, events."""

from __future__ import annotations

from radixray.cache_index import (
    ApproxIndex,
    BlockRemoved,
    BlockStored,
    PageAllocator,
    RadixCache,
    hash_blocks,
)

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


def _loaded_back(cache, alloc, tokens):
    """``tokens`` on both tiers: computed, demoted, loaded back (host copy kept), unlocked."""
    put(cache, alloc, tokens)
    cache.evict(len(tokens) // cache.page_size)
    m = cache.match_prefix(tokens + [0])
    cache.lock(m.host_node)
    m = cache.load_back(m, alloc.alloc(len(m.host_pages)))
    cache.unlock(m.node)
    cache.take_events(), cache.take_copies()
    return m


def test_host_room_drops_a_device_nodes_host_copy_before_forgetting_a_prefix():
    # a is on both tiers (loaded back); the host tier (4 pages) holds a's copy and c. Demoting
    # b needs 2 host pages: a's copy goes (a stays on the device), c stays on the host.
    cache, alloc, host_alloc = tiered(device=6, host=4)
    a, b, c = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]
    put(cache, alloc, c)
    cache.evict(2)  # c -> host
    _loaded_back(cache, alloc, a)  # host: c and a's copy (full)
    put(cache, alloc, b)
    cache.match_prefix(a + [0])  # a is used more recently than b: b is the device LRU leaf
    cache.take_events()
    assert host_alloc.num_free == 0
    assert cache.evict(2) == 2
    ha, hb = hash_blocks(a, 2), hash_blocks(b, 2)
    assert cache.take_events() == [
        BlockRemoved(ha, "CPU"),  # the dropped copy
        BlockStored(hb, None, b, 2, "CPU"),
        BlockRemoved(hb, "GPU"),
    ]
    assert cache.host.dropped_copy_pages == 2 and cache.host.evicted_pages == 0
    assert len(cache.match_prefix(a + [0]).pages) == 2  # still on the device
    assert cache.match_prefix(c + [0]).host_tokens == 4  # c is still held
    assert cache.match_prefix(b + [0]).host_tokens == 4
    assert cache.was_evicted(ha) == 0
    assert cache.host_tokens == 8 and cache.total_tokens == 4
    cache.check_integrity(held_pages=[])
    # a's next demotion copies it again (its copy is gone); the host makes room from c or b
    cache.take_copies()
    assert cache.evict(2) == 2
    assert [cp.to_host for cp in cache.take_copies()] == [True]
    cache.check_integrity(held_pages=[])


def test_a_dropped_host_copy_leaves_the_index_device_resident():
    cache, alloc, host_alloc = tiered(device=6, host=2)
    a, b = [1, 2, 3, 4], [5, 6, 7, 8]
    index = ApproxIndex(page_size=2)
    put(cache, alloc, a)
    cache.evict(2)
    index.apply("w", cache.take_events())
    _loaded_back(cache, alloc, a)  # take_events inside: apply a's device store by hand
    index.apply("w", [BlockStored(hash_blocks(a, 2), None, a, 2, "GPU")])
    put(cache, alloc, b)
    cache.match_prefix(a + [0])
    cache.evict(2)  # b demoted: a's host copy is dropped for it
    index.apply("w", cache.take_events())
    ha, hb = hash_blocks(a, 2), hash_blocks(b, 2)
    assert index.match_tiers(ha) == {"w": (2, 2)}  # a: device-resident, no longer on the host
    assert index.match_tiers(hb) == {"w": (0, 2)}
    assert index.num_blocks("w", "host") == 2


def test_locked_host_copies_are_not_dropped():
    cache, alloc, host_alloc = tiered(device=6, host=2)
    a, b = [1, 2, 3, 4], [5, 6, 7, 8]
    m = _loaded_back(cache, alloc, a)
    cache.lock(m.node)  # a request uses a: its copy is not dropped, b is forgotten instead
    put(cache, alloc, b)
    cache.take_events()
    assert cache.evict(2) == 2
    assert cache.take_events() == [BlockRemoved(hash_blocks(b, 2), "GPU")]
    assert cache.host.dropped_copy_pages == 0 and cache.host_tokens == 4
    cache.unlock(m.node)
    cache.check_integrity(held_pages=[])


def test_spare_host_pages_count_free_pages_and_droppable_copies():
    cache, alloc, host_alloc = tiered(device=6, host=4)
    assert cache.host_spare_pages == 4
    m = _loaded_back(cache, alloc, [1, 2, 3, 4])  # 2 host pages hold a copy of a device node
    assert host_alloc.num_free == 2 and cache.host_spare_pages == 4
    cache.lock(m.node)  # a locked copy is not dropped
    assert cache.host_spare_pages == 2
    cache.unlock(m.node)
    cache.evict(2)  # demoted: the copy is now the only one
    assert cache.host_spare_pages == 2
    assert RadixCache(2, PageAllocator(4)).host_spare_pages == 0
