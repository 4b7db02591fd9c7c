"""Write-through after N hits (RadixCache(host_write_through_hits=N)): a device node hit N times
gets a host copy when a lock takes it, so its later demotion frees device pages without a copy."""

from __future__ import annotations

import pytest

from radixray.cache_index import BlockRemoved, BlockStored, PageAllocator, RadixCache, hash_blocks

from .helpers import put


def tiered(hits, P=2, device=4, host=4):
    alloc, host_alloc = PageAllocator(device), PageAllocator(host)
    cache = RadixCache(
        P, alloc, enable_events=True, host_allocator=host_alloc, host_write_through_hits=hits
    )
    return cache, alloc, host_alloc


def hit_and_lock(cache, tokens):
    m = cache.match_prefix(tokens)
    cache.lock(m.node)
    return m


@pytest.mark.parametrize("hits", [1, 2])
def test_a_node_hit_n_times_is_copied_to_host_and_its_demotion_copies_nothing(hits):
    cache, alloc, host_alloc = tiered(hits)
    a = [1, 2, 3, 4]
    put(cache, alloc, a)
    cache.take_events()
    h = hash_blocks(a, 2)
    for k in range(1, hits + 1):
        m = hit_and_lock(cache, a + [9])
        copies = cache.take_copies()
        if k < hits:  # not yet: nothing copied
            assert copies == [] and host_alloc.num_free == 4 and cache.take_events() == []
        cache.unlock(m.node)
    (copy,) = copies
    assert copy.to_host and copy.src == m.pages and len(copy.dst) == 2
    assert cache.take_events() == [BlockStored(h, None, a, 2, "CPU")]
    assert cache.host_tokens == 4 and cache.total_tokens == 4  # both tiers hold it
    assert cache.host.written_through_pages == 2
    cache.check_integrity(held_pages=[])
    # a second lock copies nothing more; a demotion frees the device pages without a copy
    cache.unlock(hit_and_lock(cache, a + [9]).node)
    assert cache.take_copies() == []
    assert cache.evict(2) == 2
    assert cache.take_copies() == [] and cache.take_events() == [BlockRemoved(h, "GPU")]
    assert alloc.num_free == 4 and host_alloc.num_free == 2
    m = cache.match_prefix(a + [9])
    assert (m.num_tokens, m.host_tokens) == (0, 4)
    cache.check_integrity(held_pages=[])


def test_off_by_default_and_a_bad_value_is_refused():
    cache, alloc, host_alloc = tiered(None)
    put(cache, alloc, [1, 2, 3, 4])
    for _ in range(3):
        cache.unlock(hit_and_lock(cache, [1, 2, 3, 4, 9]).node)
    assert cache.take_copies() == [] and host_alloc.num_free == 4
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="host_write_through_hits"):
            tiered(bad)


def test_write_through_makes_room_from_host_leaves_and_spares_the_locked_path():
    cache, alloc, host_alloc = tiered(1, device=4, host=2)
    put(cache, alloc, [5, 6])
    cache.evict(1)  # [5, 6] demoted: the host tier's only page in use
    a = [1, 2, 3, 4]
    put(cache, alloc, a)
    cache.take_copies(), cache.take_events()
    m = hit_and_lock(cache, a + [9])
    # two host pages needed, one free: the host-only leaf [5, 6] is evicted for room
    assert cache.take_events() == [
        BlockRemoved(hash_blocks([5, 6], 2), "CPU"),
        BlockStored(hash_blocks(a, 2), None, a, 2, "CPU"),
    ]
    assert cache.was_evicted(hash_blocks([5, 6], 2)) == 1
    cache.check_integrity()
    cache.unlock(m.node)
    cache.check_integrity(held_pages=[])


def test_engine_config_takes_the_option_and_refuses_a_bad_value_naming_the_flag():
    from radixray.worker.engine import Engine
    from radixray.worker.engine_config import EngineConfig

    with pytest.raises(ValueError, match="--host-write-through-hits"):
        EngineConfig(host_write_through_hits=0)
    cfg = EngineConfig(model="tiny", device="cpu", num_pages=16, host_pages=8,
                       host_write_through_hits=2)  # fmt: skip
    assert Engine(cfg).cache.write_through_hits == 2
