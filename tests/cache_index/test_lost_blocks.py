"""LostBlocks: the blocks workers evicted for good, and how often they are computed again; the
index feeds it from real caches' KV events."""

from __future__ import annotations

import pytest

from radixray.cache_index import (
    AllBlocksCleared,
    ApproxIndex,
    BlockRemoved,
    BlockStored,
    hash_blocks,
)
from radixray.cache_index.events import SLIDING_WINDOW
from radixray.cache_index.lost_blocks import MAX_LOST_BLOCKS, LostBlocks

from .helpers import make_cache, put
from .test_host_tier import tiered


def _store(lost: LostBlocks, hashes, owners=None, host=None, slot=0) -> int:
    return lost.stored(hashes, owners or {}, host or {}, slot)


def test_rate_is_returns_over_losses_from_a_prior():
    lost = LostBlocks(capacity=1000, prior_blocks=10)
    assert lost.rate(0.4) == pytest.approx(0.4)  # nothing lost yet: the prior
    lost.lost(list(range(100)))
    keep = 1 - 1e-3  # one loss keeps this much of every count
    n = sum(keep**i for i in range(100))  # 100 losses, one after another: ~95.2
    w = 10 * keep**100  # the prior's weight, forgotten as the losses are
    assert lost.losses == pytest.approx(n) and lost.returns == 0
    assert lost.rate(0.4) == pytest.approx(0.4 * w / (n + w))
    assert _store(lost, [0, 1, 2, 500]) == 3  # 500 was never lost
    assert _store(lost, [0, 1]) == 0  # each loss returns once: the store forgot them
    assert lost.rate(0.4) == pytest.approx((3 + 0.4 * w) / (n + w))
    # held by another worker (slot 1) or on a host tier: computed again by choice, not a return
    assert _store(lost, [3, 4, 5], owners={3: 0b10, 4: 0b01}, host={5: 0b01}, slot=0) == 1
    assert 3 not in lost.ghost and 5 not in lost.ghost  # but forgotten all the same
    lost.lost([1000])  # every count decays by one loss, the prior's weight too
    assert lost.returns == pytest.approx(4 * keep)
    assert lost.losses == pytest.approx(n * keep + 1)
    assert lost.prior_weight == pytest.approx(10 * keep**101)
    assert lost.stats() == {"lost_blocks": 101, "returned_blocks": 4, "ghost_blocks": 95}


def test_the_ghost_horizon_and_the_memory_follow_the_capacity():
    lost = LostBlocks(capacity=4, prior_blocks=1)
    lost.lost([1, 2, 3, 4, 5, 6])  # 1 and 2 fall out of the ghost
    assert _store(lost, [1]) == 0 and _store(lost, [3, 4]) == 2
    lost.resize(1)  # the oldest beyond the new horizon go at once
    assert len(lost.ghost) == 1 and _store(lost, [5]) == 0 and _store(lost, [6]) == 1
    lost.resize(2)
    lost.lost([7])
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


def test_an_eviction_without_a_host_tier_is_a_loss_and_its_recompute_a_return():
    cache, alloc = make_cache(2, num_pages=4, enable_events=True)
    index = ApproxIndex(page_size=2)
    a = [1, 2, 3, 4]
    put(cache, alloc, a)
    index.apply("w", cache.take_events())
    assert index.lost.total_losses == 0  # stored, nothing lost
    assert cache.evict(2) == 2
    index.apply("w", cache.take_events())
    h = hash_blocks(a, 2)
    assert index.lost.total_losses == 2 and all(x in index.lost.ghost for x in h)
    index.insert("w", h)  # the router's own insert of the request it sent back there
    put(cache, alloc, a)  # computed again: its store event is the return
    index.apply("w", cache.take_events())
    assert index.stats()["lost_blocks"] == 2 and index.stats()["returned_blocks"] == 2
    assert len(index.lost.ghost) == 0


def test_a_demotion_and_a_load_back_are_not_losses_a_host_drop_is():
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
    assert index.lost.total_losses == 2 and all(x in index.lost.ghost for x in hash_blocks(a, 2))
    m = cache.match_prefix(b + [0])  # b loaded back from the host: not computed, not a return
    cache.lock(m.host_node)
    cache.load_back(m, alloc.alloc(2))
    index.apply("w", cache.take_events())
    assert index.lost.total_returns == 0 and index.lost.total_losses == 2


def test_a_device_removal_with_a_host_copy_is_not_a_loss_nor_the_copys_drop():
    index = ApproxIndex(page_size=2)
    index.insert("w", [11, 12])
    index.insert("w", [11, 12], tier="host")  # written through: a copy on both tiers
    index.apply("w", [BlockRemoved([11, 12], "CPU")])  # the copy dropped, the device keeps it
    assert index.lost.total_losses == 0
    index.insert("w", [11, 12], tier="host")
    index.apply("w", [BlockRemoved([11, 12], "GPU")])  # demoted without a copy: still held
    assert index.lost.total_losses == 0
    index.apply("w", [BlockRemoved([11, 12], "CPU")])  # and now gone
    assert index.lost.total_losses == 2


def test_a_block_trimmed_by_the_index_is_still_lost_when_the_worker_evicts_it():
    index = ApproxIndex(page_size=2, max_blocks_per_worker=2)
    index.insert("w", [1, 2, 3])  # 3 (deepest, so oldest) trimmed by the index's own bound
    assert index.trimmed_blocks == 1 and index.lost.total_losses == 0
    index.apply("w", [BlockRemoved([3])])  # the worker's eviction of it is a loss all the same
    assert index.lost.total_losses == 1


def test_a_restart_and_a_window_drop_lose_nothing():
    index = ApproxIndex(page_size=2)
    index.insert("w", [1, 2])
    window = {"kind": SLIDING_WINDOW, "window": 4}
    index.apply("w", [BlockStored([1, 2], None, [0] * 4, 2, **window)])
    index.apply("w", [BlockRemoved([1, 2], **window)])  # the window pages only: blocks stay
    index.apply("w", [AllBlocksCleared()])  # a restart, not an eviction
    assert index.lost.total_losses == 0
