"""MambaRadixCache with a host tier (``mamba_host``), exact page and slot ids: page size 2, 16
device pages, 4 device state slots, 8 host pages, 2 host state slots unless a test says.

Tokens 1..8 are pages (1 2)(3 4)(5 6)(7 8); "a checkpoint at 4" holds the state after 1..4.
The design under test: a demoted node's checkpoint is demoted with it (copied to a host slot),
a host checkpoint stays there after its KV is loaded back (the request copies it into its own
slot), and the state pool's evictions move checkpoints to the host before dropping any.
"""

from __future__ import annotations

from radixray.cache_index import ApproxIndex, PageAllocator, hash_blocks
from radixray.cache_index.host_tier import PageCopy
from radixray.cache_index.mamba_radix_cache import MambaRadixCache

T = [1, 2, 3, 4, 5, 6, 7, 8]
H = hash_blocks(T, 2)


def make(host_slots: int = 2, host_pages: int = 8):
    alloc, states = PageAllocator(16), PageAllocator(4)
    hp, hs = PageAllocator(host_pages), PageAllocator(host_slots)
    cache = MambaRadixCache(
        2, alloc, states, enable_events=True, host_allocator=hp, host_state_allocator=hs
    )
    return cache, alloc, states, hs


def put(cache, alloc, states, tokens, at):
    pages = alloc.alloc(len(tokens) // 2)
    slots = states.alloc(len(at))
    cached = cache.insert(tokens, pages, states=dict(zip(at, slots, strict=True)))
    alloc.free(pages[: cached // 2])
    return pages, slots


def check(cache):
    cache.check_integrity(held_pages=[], held_slots=[])


def kinds(events):
    return [(e.medium, e.kind, e.block_hashes) for e in events]


def test_a_demoted_node_takes_its_checkpoint_to_the_host_and_a_load_back_resumes_there():
    cache, alloc, states, hs = make()
    put(cache, alloc, states, T, [4, 8])  # pages 0-3; slot 0 at 4, slot 1 at 8
    cache.take_events()
    assert cache.evict(1) == 2  # the leaf (5 6)(7 8) goes to host pages 0, 1 with its state
    assert cache.take_copies() == [
        PageCopy(True, [2, 3], [0, 1]),
        PageCopy(True, [1], [0], state=True),  # device slot 1 -> host slot 0
    ]
    assert kinds(cache.take_events()) == [
        ("CPU", "full_attention", H[2:]),
        ("GPU", "full_attention", H[2:]),
        ("CPU", "mamba", H[3:]),
    ]
    assert states.num_free == 3 and hs.num_free == 1  # the device slot is free again
    check(cache)
    m = cache.match_prefix(T + [9])
    assert (m.pages, m.num_tokens, list(m.host_pages), m.host_tokens) == ([0, 1], 4, [0, 1], 4)
    assert (m.state_slot, m.state_host, m.state_tokens) == (0, True, 0)
    # a caller that cannot load it back starts from the device's checkpoint at 4
    d = cache.device_part(m)
    assert (d.pages, d.num_tokens, d.state_slot, d.state_host, d.state_tokens) == (
        [0, 1], 4, 0, False, 4,
    )  # fmt: skip
    cache.lock(m.host_node)
    full = cache.load_back(m, alloc.alloc(2))
    assert (full.pages, full.num_tokens, full.state_slot, full.state_host) == (
        [0, 1, 2, 3], 8, 0, True,
    )  # fmt: skip
    assert cache.take_copies() == [PageCopy(False, [0, 1], [2, 3])]  # KV only: state stays
    cache.lock_state(full.node, host=True)  # until its copy into the request's slot is queued
    assert not cache.host.make_state_room(2)  # a locked host checkpoint is not evicted
    cache.unlock_state(full.node, host=True)
    cache.unlock(m.host_node)
    check(cache)


def test_a_short_state_pool_moves_checkpoints_to_the_host_before_dropping_any():
    cache, alloc, states, hs = make()
    put(cache, alloc, states, T, [4, 8])
    cache.take_events()
    assert cache.evict_states(1) == 1  # the one at 4 (older at equal times) moves to host slot 0
    assert cache.take_copies() == [PageCopy(True, [0], [0], state=True)]
    assert kinds(cache.take_events()) == [("CPU", "mamba", H[1:2]), ("GPU", "mamba", H[1:2])]
    m = cache.match_prefix([1, 2, 3, 4, 9, 9])  # device KV, host checkpoint: usable
    assert (m.num_tokens, m.state_slot, m.state_host) == (4, 0, True)
    assert cache.evict_states(1) == 1  # the one at 8 to host slot 1
    assert cache.evict_states(1) == 0 and cache.num_states == 0  # nothing left on the device
    assert hs.num_free == 0 and cache.total_tokens == 8  # no KV was lost
    check(cache)


def test_host_slots_evict_least_recent_first_and_a_childless_tombstone_leaves():
    cache, alloc, states, hs = make(host_slots=1)
    put(cache, alloc, states, T[:4], [4])  # (1 2)(3 4): pages 0, 1, slot 0
    put(cache, alloc, states, [1, 2, 9, 9], [4])  # (9 9) under (1 2): page 3, slot 1
    assert cache.evict(1) == 1  # LRU leaf (3 4) -> host page 0 and host slot 0
    cache.take_copies()
    assert cache.evict(1) == 1  # (9 9): host slot 0 is taken by (3 4)'s, evicted for it,
    # and (3 4), childless with no checkpoint left, leaves the tree with its host page
    assert cache.take_copies() == [
        PageCopy(True, [3], [1]),
        PageCopy(True, [1], [0], state=True),
    ]
    assert cache.host.evicted_states == 1 and cache.match_prefix(T[:4] + [9]).num_tokens == 0
    m = cache.match_prefix([1, 2, 9, 9, 1])
    assert (m.host_tokens, m.state_slot, m.state_host) == (2, 0, True)
    assert cache.total_tokens == 2 and cache.host_tokens == 2  # (1 2) on the device, (9 9) host
    check(cache)


def test_no_host_slot_to_be_had_forgets_a_childless_node():
    cache, alloc, states, hs = make(host_slots=1)
    put(cache, alloc, states, T[:4], [4])
    put(cache, alloc, states, [5, 6], [2])  # another root child: page 2, slot 1
    cache.evict(1)  # (1 2)(3 4) is older: demoted, host slot 0
    m = cache.match_prefix(T[:4] + [9])
    cache.lock(m.host_node)
    cache.lock_state(m.host_node, host=True)  # held: its host slot cannot be taken
    assert cache.evict(1) == 1  # (5 6) cannot take its state along: forgotten, not demoted
    assert cache.match_prefix([5, 6, 7]).host_tokens == 0 and states.num_free == 4
    cache.unlock_state(m.host_node, host=True)
    cache.unlock(m.host_node)
    check(cache)
    cache.reset()
    assert hs.num_free == 1 and states.num_free == 4 and alloc.num_free == 16
    check(cache)


def test_a_recompute_through_a_host_checkpoint_gives_the_device_one_back():
    cache, alloc, states, hs = make()
    put(cache, alloc, states, T, [4, 8])
    cache.evict_states(2)  # both to the host
    pages, slots = put(cache, alloc, states, T, [4, 8])  # a request computed them again
    assert cache.num_states == 2 and states.num_free == 2  # adopted: both tiers hold them
    assert cache.host.make_state_room(2) and hs.num_free == 2  # host copies go first, free
    assert cache.host.evicted_states == 2 and cache.num_states == 2
    check(cache)


def test_the_index_keeps_checkpoints_per_tier():
    cache, alloc, states, hs = make()
    put(cache, alloc, states, T, [4, 8])
    index = ApproxIndex(2)
    index.apply("w", cache.take_events())
    cache.evict(1)  # (5 6)(7 8) and its checkpoint at 8 to the host
    index.apply("w", cache.take_events())
    assert index._states.held("w") == {H[1]} and index._states.held("w", "host") == {H[3]}
    assert index.match(H) == {"w": 2}  # the device's answer: to its checkpoint at 4
    assert index.match_tiers(H) == {"w": (2, 4)}  # over both tiers: to the host one at 8
    cache.evict_states(1)  # the one at 4 moves to the host: KV stays on the device
    index.apply("w", cache.take_events())
    assert index._states.held("w") == set() and index._states.held("w", "host") == {H[1], H[3]}
    assert index.match_tiers(H) == {"w": (2, 4)}
    fresh = ApproxIndex(2)
    fresh.apply("w", cache.snapshot_events())
    assert fresh.match_tiers(H) == {"w": (2, 4)}
    assert fresh._states.held("w", "host") == {H[1], H[3]}
    cache.evict(4)  # everything to the host; then the host's own LRU frees it all
    cache.make_host_room(8)
    index.apply("w", cache.take_events())
    assert cache.total_tokens == 0 and cache.host_tokens == 0 and hs.num_free == 2
    assert index.match_tiers(H) == {} and index._states.held("w", "host") == set()
    check(cache)
