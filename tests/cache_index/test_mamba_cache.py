"""MambaRadixCache with exact page ids and state-slot ids (page_size 2, 16 pages, 4 slots).

Tokens 1..8 at page size 2 are pages (1 2)(3 4)(5 6)(7 8); a checkpoint "at 4" holds the state
after tokens 1..4.
"""

from __future__ import annotations

import pytest

from radixray.cache_index import ApproxIndex, PageAllocator, hash_blocks
from radixray.cache_index.mamba_radix_cache import MambaRadixCache
from radixray.cache_index.prefix_cache import make_cache

T = [1, 2, 3, 4, 5, 6, 7, 8]


def make(slots: int = 4):
    alloc, states = PageAllocator(16), PageAllocator(slots)
    return MambaRadixCache(2, alloc, states), alloc, states


def check(cache, held_pages=(), held_slots=()):
    cache.check_integrity(held_pages=list(held_pages), held_slots=list(held_slots))


def put(cache, alloc, states, tokens, at):
    """A request that computed ``tokens`` and checkpointed after each of ``at`` inserts them;
    returns (its pages, its slots)."""
    pages = alloc.alloc(len(tokens) // 2)
    slots = states.alloc(len(at))
    cached = cache.insert(tokens, pages, states=dict(zip(at, slots, strict=True)))
    alloc.free(pages[: cached // 2])  # its duplicates of what was cached
    return pages, slots


def test_match_stops_at_the_deepest_checkpoint():
    cache, alloc, states = make()
    pages, slots = put(cache, alloc, states, T, [4, 8])
    assert (pages, slots) == ([0, 1, 2, 3], [0, 1])
    m = cache.match_prefix(T + [9])
    assert (m.pages, m.num_tokens, m.state_slot, m.state_tokens) == ([0, 1, 2, 3], 8, 1, 0)
    # KV matches 6 tokens, the deepest checkpoint within them is at 4
    m = cache.match_prefix([1, 2, 3, 4, 5, 6, 9, 9, 9])
    assert (m.pages, m.num_tokens, m.state_slot, m.state_tokens) == ([0, 1], 4, 0, 2)
    assert cache.state_at(m.node) == 0
    # KV matches 2 tokens, no checkpoint: nothing usable
    m = cache.match_prefix([1, 2, 9, 9])
    assert (m.pages, m.num_tokens, m.state_slot, m.state_tokens) == ([], 0, None, 2)
    assert m.node.parent is None
    assert cache.peek_prefix(T + [9], hash_blocks(T, 2)) == 8
    u = [1, 2, 3, 4, 5, 6, 9, 9]
    assert cache.peek_prefix(u, hash_blocks(u, 2)) == 4
    check(cache)


def test_insert_needs_a_checkpoint_at_a_new_leaf():
    cache, alloc, states = make()
    pages = alloc.alloc(4)
    with pytest.raises(ValueError, match="no checkpoint"):
        cache.insert(T, pages, states={4: states.alloc(1)[0]})
    assert cache.total_tokens == 0 and states.num_free == 3  # nothing changed
    with pytest.raises(ValueError, match="not page ends"):
        cache.insert(T, pages, states={3: 0})
    # up to the last checkpoint: the request keeps (and frees) the pages after it
    assert cache.insert(T[:4], pages[:2], states={4: 0}) == 0
    alloc.free(pages[2:])
    # a prefix of what is cached needs no checkpoint; re-inserting it changes nothing
    assert cache.insert(T[:2], [9]) == 2
    check(cache)


def test_duplicate_checkpoint_is_freed_and_a_tombstone_revived():
    cache, alloc, states = make()
    put(cache, alloc, states, T, [4, 8])  # pages 0-3, slots 0 (at 4), 1 (at 8)
    assert cache.evict_states(1) == 1  # equal times: the shallower (at 4) goes first
    assert states.num_free == 3 and cache.num_states == 1
    m = cache.match_prefix([1, 2, 3, 4, 9])  # its checkpoint is gone: a tombstone
    assert (m.num_tokens, m.state_slot, m.state_tokens) == (0, None, 4)
    check(cache)
    # a request that recomputed through the tombstone gives it its checkpoint back (slot 0
    # again), and its copy of the checkpoint at 8 is a duplicate: freed
    pages, slots = put(cache, alloc, states, T, [4, 8])
    assert (pages, slots) == ([4, 5, 6, 7], [0, 2])
    assert cache.insert(T, [0, 1, 2, 3]) == 8
    m = cache.match_prefix([1, 2, 3, 4, 9])
    assert (m.pages, m.num_tokens, m.state_slot) == ([0, 1], 4, 0)
    assert states.num_free == 2 and alloc.num_free == 12
    check(cache)


def test_a_leaf_losing_its_checkpoint_goes_with_the_tombstones_above_it():
    cache, alloc, states = make()
    put(cache, alloc, states, T, [4, 8])
    assert cache.evict_states(1) == 1  # at 4: a tombstone under the leaf
    assert cache.evict_states(1) == 1  # the leaf at 8: its KV, then the tombstone's
    assert cache.total_tokens == 0 and alloc.num_free == 16 and states.num_free == 4
    assert cache.evict_states(1) == 0
    check(cache)


def test_kv_eviction_frees_the_leafs_checkpoint_and_tombstones():
    cache, alloc, states = make()
    put(cache, alloc, states, T, [4, 8])
    put(cache, alloc, states, [1, 2, 3, 4, 9, 9], [6])  # a branch at 4: slot 2, page 4
    cache.evict_states(1)  # at 4 (the oldest, shallowest): a tombstone with two children
    assert sorted(cache.cached_slots()) == [1, 2]
    assert cache.evict(1) == 2  # the oldest leaf, (5 6)(7 8): pages 2, 3 and slot 1
    assert sorted(cache.cached_slots()) == [2]
    assert cache.evict(1) == 3  # the leaf (9 9), then the tombstone (1 2)(3 4) left a leaf
    assert alloc.num_free == 16 and states.num_free == 4 and cache.total_tokens == 0
    check(cache)


def test_match_touches_its_checkpoint_so_ancestors_go_first():
    cache, alloc, states = make()
    put(cache, alloc, states, T[:4], [4])  # slot 0 at 4
    put(cache, alloc, states, T, [8])  # slot 1 at 8, inserted later
    cache.match_prefix(T[:4] + [9])  # touches the checkpoint at 4 only
    cache.match_prefix(T + [9])  # then the one at 8: 4 is now the older
    assert cache.evict_states(1) == 1 and cache.cached_slots() == [1]
    check(cache)


def test_a_paths_inner_checkpoints_are_spare_until_a_match_resumes_there():
    cache, alloc, states = make(slots=6)
    _, (b4,) = put(cache, alloc, states, [9, 9, 9, 9], [4])  # an older conversation's end
    _, (a4, a8, a12) = put(cache, alloc, states, T + [5, 5, 5, 5], [4, 8, 12])
    # newer than b4, but a4 and a8 are inner points of a path that goes on to 12: spare
    assert cache.evict_states(1) == 1 and set(cache.cached_slots()) == {b4, a8, a12}
    # a request branching after 8 resumes there: a8 is not spare any more (and is the newest)
    m = cache.match_prefix(T + [7, 7])
    assert (m.num_tokens, m.state_slot) == (8, a8)
    assert cache.evict_states(1) == 1 and set(cache.cached_slots()) == {a8, a12}  # b4: oldest
    assert cache.evict_states(1) == 1 and cache.cached_slots() == [a8]  # a12 older than a8
    check(cache)
    # a new deeper checkpoint does not make a resumed one spare again
    put(cache, alloc, states, T + [5, 5, 5, 5, 6, 6], [12, 14])
    _, (c4,) = put(cache, alloc, states, [8, 8, 8, 8], [4])
    assert cache.evict_states(1) == 1  # the spare a12 (inner now), not a8 nor the newer c4
    assert 8 == cache.match_prefix(T + [7]).num_tokens and c4 in cache.cached_slots()
    check(cache)


def test_locks_keep_the_path_and_the_checkpoint():
    cache, alloc, states = make()
    put(cache, alloc, states, T, [4, 8])
    m = cache.match_prefix(T + [9])
    cache.lock(m.node)  # a request resumes at 8
    cache.lock_state(m.node)  # until its copy of slot 1 is done
    assert cache.evict(16) == 0
    assert cache.evictable_states() == 1  # the inner checkpoint at 4 only
    assert cache.evict_states(4) == 1 and cache.cached_slots() == [1]
    cache.unlock_state(m.node)
    assert cache.evict_states(4) == 0  # a request's lock ends here: still kept
    check(cache)
    cache.unlock(m.node)
    assert cache.evict_states(4) == 1 and alloc.num_free == 16
    with pytest.raises(ValueError):
        cache.unlock_state(m.node)
    check(cache)


def test_integrity_counts_slots_held_by_requests():
    cache, alloc, states = make()
    put(cache, alloc, states, T, [8])
    mine = states.alloc(2)  # a running request's slot and a checkpoint it has not inserted
    check(cache, held_slots=mine)
    with pytest.raises(AssertionError, match="leak"):
        check(cache, held_slots=mine[:1])
    with pytest.raises(AssertionError):
        check(cache, held_slots=mine + [0])  # slot 0 is the tree's
    states.free(mine)
    cache.reset()
    assert states.num_free == 4 and alloc.num_free == 16
    check(cache, held_slots=[])


def test_registry_builds_it():
    cache = make_cache("mamba_radix", 2, PageAllocator(4), state_allocator=PageAllocator(2))
    assert isinstance(cache, MambaRadixCache)
    with pytest.raises(ValueError, match="host_state_allocator"):  # host pages need host slots
        MambaRadixCache(2, PageAllocator(4), PageAllocator(2), host_allocator=PageAllocator(4))


def test_an_evicted_leaf_leaves_its_checkpointed_parent():
    cache, alloc, states = make()
    put(cache, alloc, states, T, [4, 8])
    assert cache.evict(1) == 2  # (5 6)(7 8) and slot 1; (1 2)(3 4) keeps slot 0
    m = cache.match_prefix(T + [9])
    assert (m.pages, m.num_tokens, m.state_slot, m.state_tokens) == ([0, 1], 4, 0, 0)
    assert states.num_free == 3 and alloc.num_free == 14
    check(cache)


def test_events_name_checkpointed_blocks_in_the_mamba_group():
    alloc, states = PageAllocator(16), PageAllocator(4)
    cache = MambaRadixCache(2, alloc, states, enable_events=True)
    h = hash_blocks(T, 2)
    put(cache, alloc, states, T, [4, 8])
    ev = cache.take_events()
    # the KV to 4 and its checkpoint, then the KV to 8 and its checkpoint
    assert [(e.block_hashes, e.kind, e.group_idx) for e in ev] == [
        (h[:2], "full_attention", 0),
        (h[1:2], "mamba", 1),
        (h[2:], "full_attention", 0),
        (h[3:], "mamba", 1),
    ]
    assert (ev[1].parent_block_hash, ev[1].token_ids) == (h[0], [3, 4])
    cache.evict_states(1)  # at 4: a tombstone, gone from the mamba group only
    (removed,) = cache.take_events()
    assert (removed.block_hashes, removed.kind) == (h[1:2], "mamba")
    index = ApproxIndex(2)
    index.apply("w", cache.snapshot_events())
    assert index.match(h) == {"w": 4}
    assert index.match(hash_blocks([1, 2, 3, 4, 5, 6, 9, 9], 2)) == {}  # KV 3 blocks, no state
    blind = ApproxIndex(2, states=False)  # checkpoint-blind: KV blocks only
    blind.apply("w", cache.snapshot_events())
    assert blind.match(hash_blocks([1, 2, 3, 4, 5, 6, 9, 9], 2)) == {"w": 3}
    # the router's own insert marks a request's last block: the worker checkpoints there
    index.insert("w", hash_blocks([1, 2, 7, 7, 7, 7], 2))
    assert index.match(hash_blocks([1, 2, 7, 7, 7, 7, 5, 5], 2)) == {"w": 3}
    assert index.match(hash_blocks([1, 2, 7, 7, 5, 5], 2)) == {}


def test_unkept_blocks_are_remembered_for_attribution():
    cache, alloc, states = make()
    h = hash_blocks(T, 2)
    put(cache, alloc, states, T[:4], [4])  # a request computed 8 tokens, checkpointed at 4
    cache.note_unkept(h[2:])  # and kept nothing past it
    assert cache.was_unkept(h[2:]) == 2 and cache.was_unkept(h[:2]) == 0
    assert cache.was_evicted(h[2:]) == 0


def test_the_index_lru_bound_drops_a_trimmed_blocks_checkpoint_mark():
    """A block the router's index trims by its per-worker LRU bound loses its checkpoint mark
    too, so the marks stay within the bound (they grew without it)."""
    alloc, states = PageAllocator(16), PageAllocator(4)
    cache = MambaRadixCache(2, alloc, states, enable_events=True)
    h = hash_blocks(T, 2)
    put(cache, alloc, states, T, [4, 8])
    index = ApproxIndex(2, max_blocks_per_worker=4)
    index.apply("w", cache.take_events())
    assert index._states.held("w") == {h[1], h[3]}
    index.insert("w", hash_blocks([9, 9, 9, 9, 9, 9], 2))  # 3 new blocks: 3 of 4 trimmed
    assert index._states.held("w") <= set(index._lru["w"])


def _tree(cache):
    """Every node as (its path's tokens, pages, hashes, checkpoint slot), in path order."""
    rows = []
    for node in cache._tree.iter_nodes():
        path, n = [], node
        while n.parent is not None:
            path[:0] = n.key
            n = n.parent
        rows.append((tuple(path), node.pages, node.hashes, cache.state_at(node)))
    return sorted(rows)


def test_one_insert_of_checkpoints_equals_an_insert_per_checkpoint():
    # (1 2 3 4 5 6 7 8) is one node with a checkpoint at 8; the request checkpoints at 4
    # (inside it: a split), 8 (its end: a duplicate, freed), 10 and 14 (a new leaf, split).
    R = T + [11, 12, 13, 14, 15, 16]
    caches = []
    for _ in range(2):
        alloc, states = PageAllocator(32), PageAllocator(8)
        cache = MambaRadixCache(2, alloc, states, enable_events=True)
        put(cache, alloc, states, T, [8])
        cache.take_events()
        caches.append((cache, alloc, states, alloc.alloc(7), states.alloc(4)))
    at = [4, 8, 10, 14]
    one, alloc1, states1, pages, slots = caches[0]
    got = one.insert(R, pages, states=dict(zip(at, slots, strict=True)))
    each, alloc2, states2, pages2, slots2 = caches[1]
    assert (pages2, slots2) == (pages, slots)
    per_position = zip(at, slots, strict=True)
    rets = [each.insert(R[:p], pages[: p // 2], states={p: s}) for p, s in per_position]
    assert rets == [4, 8, 8, 10] and got == 8  # the first insert that found new tokens
    assert _tree(one) == _tree(each)
    assert _tree(one)[-1] == (tuple(R), pages[5:], hash_blocks(R, 2)[-2:], slots[3])
    assert one.take_events() == each.take_events()
    assert states1.free_pages() == states2.free_pages()  # the duplicate at 8 freed alike
    assert states1.num_free == 8 - 4  # 3 new checkpoints and the one before
    check(one, held_pages=pages[:4])
    check(each, held_pages=pages[:4])
