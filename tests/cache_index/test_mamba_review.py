"""Review of the state cache's host tier and spare checkpoints (issue 45): exact slot ids.

Page size 2, 16 device pages, 4 device state slots, 8 host pages, 2 host state slots. Tokens
``A`` = 1..8 (checkpoints at 4 and 8: the one at 4 is spare, a deeper one is on its path) and
``B`` = 11..14 (its only checkpoint at 4, a conversation's deepest).
"""

from __future__ import annotations

from radixray.cache_index import PageAllocator
from radixray.cache_index.mamba_radix_cache import MambaRadixCache

A = [1, 2, 3, 4, 5, 6, 7, 8]
B = [11, 12, 13, 14]


def make():
    alloc, states = PageAllocator(16), PageAllocator(4)
    cache = MambaRadixCache(
        2, alloc, states, host_allocator=PageAllocator(8), host_state_allocator=PageAllocator(2)
    )
    return cache, alloc, states


def put(cache, alloc, states, tokens, at):
    pages = alloc.alloc(len(tokens) // 2)
    slots = states.alloc(len(at))
    cached = cache.insert(tokens, pages, states=dict(zip(at, slots, strict=True)))
    alloc.free(pages[: cached // 2])
    return slots


def test_a_spare_checkpoint_moved_to_the_host_stays_spare_there():
    cache, alloc, states = make()
    assert put(cache, alloc, states, B, [4]) == [0]
    assert put(cache, alloc, states, A, [4, 8]) == [1, 2]  # A's 4 is spare, and newer than B's
    assert cache.evict_states(2) == 2  # A's 4 (spare) to host slot 0, then B's 4 to host slot 1
    assert sorted(cache.host.ckpt.slot.values()) == [0, 1]
    assert cache.evict_states(1) == 1  # A's 8 needs a host slot: the spare A 4 gives its own
    cache.check_integrity(held_pages=[], held_slots=[])
    b = cache.match_prefix(B + [15])
    assert (b.num_tokens, b.state_slot, b.state_host) == (4, 1, True)  # B's deepest is kept
    a = cache.match_prefix(A + [9])
    assert (a.num_tokens, a.state_slot, a.state_host) == (8, 0, True)


def test_a_match_resuming_from_a_spare_host_checkpoint_makes_it_not_spare():
    cache, alloc, states = make()
    put(cache, alloc, states, B, [4])
    put(cache, alloc, states, A, [4, 8])
    assert cache.evict_states(2) == 2  # A's 4 (spare) to host slot 0, B's 4 to host slot 1
    m = cache.match_prefix([1, 2, 3, 4, 99])  # a branch after 4 resumes from A's host 4
    assert (m.num_tokens, m.state_slot, m.state_host) == (4, 0, True)
    assert cache.evict_states(1) == 1  # A's 8 needs a host slot: the older B 4 goes now
    cache.check_integrity(held_pages=[], held_slots=[])
    assert cache.match_prefix(B + [15]).num_tokens == 0
    m = cache.match_prefix([1, 2, 3, 4, 99])
    assert (m.num_tokens, m.state_slot, m.state_host) == (4, 0, True)


def test_a_device_checkpoint_marked_spare_after_its_host_copy_was_made_leaves_it_spare():
    cache, alloc, states = make()
    put(cache, alloc, states, B, [4])
    put(cache, alloc, states, A[:4], [4])
    assert cache.evict_states(2) == 2  # B's 4 to host slot 0, A's 4 to host slot 1
    put(cache, alloc, states, A, [4, 8])  # A's 4 on the device again (spare now), and its 8
    assert cache.evict_states(1) == 1  # the spare device A 4 goes: its host copy is kept
    assert cache.evict_states(1) == 1  # A's 8 needs a host slot: the spare A 4 gives its own
    cache.check_integrity(held_pages=[], held_slots=[])
    b = cache.match_prefix(B + [15])
    assert (b.num_tokens, b.state_slot, b.state_host) == (4, 0, True)  # B's deepest is kept
    a = cache.match_prefix(A + [9])
    assert (a.num_tokens, a.state_slot, a.state_host) == (8, 1, True)


def test_a_host_only_checkpoint_above_a_deeper_one_given_is_spare():
    cache, alloc, states = make()
    put(cache, alloc, states, B, [4])
    put(cache, alloc, states, A[:4], [4])
    assert cache.evict_states(2) == 2  # B's 4 to host slot 0, A's 4 to host slot 1
    put(cache, alloc, states, A, [8])  # a request went past A's 4 without resuming there
    assert cache.evict_states(1) == 1  # A's 8 needs a host slot: the spare host A 4 gives it
    cache.check_integrity(held_pages=[], held_slots=[])
    b = cache.match_prefix(B + [15])
    assert (b.num_tokens, b.state_slot, b.state_host) == (4, 0, True)  # B's deepest is kept
    a = cache.match_prefix(A + [9])
    assert (a.num_tokens, a.state_slot, a.state_host) == (8, 1, True)
