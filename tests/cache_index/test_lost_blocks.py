"""LostBlocks: the blocks workers evicted for good, and how often requests ask for them again;
the index's removals feed it from real caches' events."""

from __future__ import annotations

import pytest

from radixray.cache_index import AllBlocksCleared, ApproxIndex, BlockRemoved, hash_blocks
from radixray.cache_index.lost_blocks import MAX_LOST_BLOCKS, LostBlocks

from .helpers import make_cache, put
from .test_host_tier import tiered


def test_rate_is_returns_over_losses_from_a_prior():
    lost = LostBlocks(capacity=1000, prior_blocks=10)
    assert lost.rate(0.4) == pytest.approx(0.4)  # nothing lost yet: the prior
    lost.lost(list(range(100)))
    keep = 1 - 1e-3  # one loss keeps this much of every count
    n = sum(keep**i for i in range(100))  # 100 losses, one after another: ~95.2
    w = 10 * keep**100  # the prior's weight, forgotten as the losses are
    assert lost.losses == pytest.approx(n) and lost.returns == 0
    assert lost.rate(0.4) == pytest.approx(0.4 * w / (n + w))
    assert lost.returned([500, 5, 6]) == 0  # leading blocks only: past a block never lost
    assert lost.returned([0, 1, 2, 500, 3]) == 3  # stops at the first block never lost
    assert lost.returned([0, 1]) == 0  # each return counts once
    assert lost.rate(0.4) == pytest.approx((3 + 0.4 * w) / (n + w))
    assert lost.returned([3], weight=4) == 1  # a router that sees a quarter of the requests
    assert lost.returns == pytest.approx(7)
    lost.lost([1000])  # every count decays by one loss, the prior's weight too
    assert lost.returns == pytest.approx(7 * keep)
    assert lost.losses == pytest.approx(n * keep + 1)
    assert lost.prior_weight == pytest.approx(10 * keep**101)
    assert lost.stats() == {"lost_blocks": 101, "returned_blocks": 4, "ghost_blocks": 97}


def test_the_ghost_horizon_and_the_memory_follow_the_capacity():
    lost = LostBlocks(capacity=4, prior_blocks=1)
    lost.lost([1, 2, 3, 4, 5, 6])  # 1 and 2 fall out of the ghost
    assert lost.returned([1]) == 0 and lost.returned([3, 4]) == 2
    lost.resize(2)
    lost.lost([7])  # the oldest go down to the new capacity
    assert len(lost.ghost) == 2 and lost.returned([6, 7]) == 2
    # the memory is the capacity in losses: a loss keeps 1 - 1/2 of every count
    before = lost.returns
    lost.lost([8])
    assert lost.returns == pytest.approx(before / 2)
    lost.resize(10**9)  # a huge fleet: the horizon stops at a million lost blocks
    assert lost.capacity == MAX_LOST_BLOCKS
    for bad in (0, -1):
        with pytest.raises(ValueError, match="capacity must be >= 1"):
            LostBlocks(capacity=bad)
        with pytest.raises(ValueError, match="capacity must be >= 1"):
            lost.resize(bad)
    with pytest.raises(ValueError, match="prior_blocks must be > 0"):
        LostBlocks(prior_blocks=0)


def test_a_device_eviction_without_a_host_tier_is_a_loss():
    cache, alloc = make_cache(2, num_pages=4, enable_events=True)
    index = ApproxIndex(page_size=2)
    a = [1, 2, 3, 4]
    put(cache, alloc, a)
    index.apply("w", cache.take_events())
    assert cache.evict(2) == 2
    index.apply("w", cache.take_events())
    h = hash_blocks(a, 2)
    assert index.lost.total_losses == 2 and all(x in index.lost.ghost for x in h)
    assert index.stats()["lost_blocks"] == 2
    assert index.lost.returned(h) == 2


def test_a_demotion_is_not_a_loss_and_a_host_eviction_is():
    cache, alloc, _ = tiered(device=4, host=2)
    index = ApproxIndex(page_size=2)
    a, b = [1, 2, 3, 4], [5, 6, 7, 8]
    put(cache, alloc, a)
    cache.evict(2)  # a -> host: stored on the host before it leaves the device
    index.apply("w", cache.take_events())
    assert index.lost.total_losses == 0
    put(cache, alloc, b)
    cache.evict(2)  # b -> host; a is dropped from the host for good
    index.apply("w", cache.take_events())
    assert index.lost.total_losses == 2
    assert index.lost.returned(hash_blocks(a, 2)) == 2
    assert index.lost.returned(hash_blocks(b, 2)) == 0  # demoted: still held


def test_a_dropped_host_copy_of_a_device_block_is_not_a_loss():
    index = ApproxIndex(page_size=2)
    index.insert("w", [11, 12])
    index.insert("w", [11, 12], tier="host")
    index.apply("w", [BlockRemoved([11, 12], "CPU")])
    assert index.lost.total_losses == 0
    index.apply("w", [BlockRemoved([11, 12], "GPU")])
    assert index.lost.total_losses == 2


def test_a_cleared_worker_and_the_index_bound_lose_nothing():
    index = ApproxIndex(page_size=2, max_blocks_per_worker=2)
    index.insert("w", [1, 2, 3])  # one trimmed by the index's own bound
    assert index.trimmed_blocks == 1
    index.apply("w", [AllBlocksCleared()])  # a restart, not an eviction
    index.remove("w", [1, 2])  # already gone from the index: nothing to lose
    assert index.lost.total_losses == 0
