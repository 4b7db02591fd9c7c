"""Unit tests of RadixCache's contract with exact page ids.

Page ids are predictable: a fresh PageAllocator hands out 0, 1, 2, ... and ``helpers.put``
allocates every page of a sequence (its partial tail too) before inserting it.
"""

import random

import pytest

from radixray.cache_index import PageAllocator, RadixCache, hash_blocks, make_cache

from .helpers import make_cache as new_cache
from .helpers import put


def test_basic_insert_and_match():
    cache, alloc = new_cache(4, num_pages=16)
    toks = list(range(10))  # 2 full pages + 2 tokens
    pages = alloc.alloc(3)
    assert pages == [0, 1, 2]
    assert cache.insert(toks, pages) == 0
    # The cache adopted the two full pages; the partial page stays with the caller.
    cache.check_integrity(held_pages=[2])
    alloc.free([2])
    assert cache.total_tokens == 8 and cache.evictable_tokens == 8 and cache.protected_tokens == 0

    r = cache.match_prefix(toks)
    assert (r.pages, r.num_tokens) == ([0, 1], 8)
    assert r.node.pages == [1] or r.node.pages == [0, 1]
    r = cache.match_prefix(toks[:7])
    assert (r.pages, r.num_tokens) == ([0], 4)
    r = cache.match_prefix(tuple(toks) + (99, 98, 97))
    assert (r.pages, r.num_tokens) == ([0, 1], 8)
    r = cache.match_prefix([99] + toks)
    assert (r.pages, r.num_tokens) == ([], 0) and r.node.is_root
    r = cache.match_prefix([])
    assert (r.pages, r.num_tokens) == ([], 0)
    # match never changes what is cached
    assert cache.total_tokens == 8 and sorted(cache.cached_pages()) == [0, 1]
    cache.check_integrity(held_pages=[])


def test_peek_reads_the_match_from_hashes_without_splitting_or_touching():
    cache, alloc = new_cache(4, num_pages=16)
    a = list(range(12))  # one node, pages [0, 1, 2]
    put(cache, alloc, a)
    (node,) = cache._tree.root().children.values()
    before = (node.last_access, node.hits)
    b = list(range(8)) + [50, 51, 52, 53]  # diverges at page 2, inside the node
    hb = hash_blocks(b, 4)
    assert cache.peek_prefix(b, hb) == 8
    assert cache.peek_prefix(b, hb[:1]) == 4  # only the pages given are looked at
    assert cache.peek_prefix(a, hash_blocks(a, 4)) == 12
    assert cache.peek_prefix(a, hash_blocks(a, 4, extra_key="x"), "x") == 0
    assert cache.peek_prefix([9] * 12, hash_blocks([9] * 12, 4)) == 0
    # Nothing moved: still one node, same access time and hits, no events.
    assert list(cache._tree.root().children.values()) == [node] and node.pages == [0, 1, 2]
    assert (node.last_access, node.hits) == before
    assert cache.match_prefix(b).num_tokens == 8  # the real match agrees (and splits)


def test_partial_match_splits_the_node():
    cache, alloc = new_cache(4, num_pages=16)
    a = list(range(12))  # pages [0, 1, 2]
    assert put(cache, alloc, a) == [0, 1, 2]
    b = list(range(6)) + [50, 51, 52, 53, 54, 55]  # diverges inside page 1
    r = cache.match_prefix(b)
    assert (r.pages, r.num_tokens) == ([0], 4)
    # The handle ends exactly at the match: a node holding page 0 only, with the rest below.
    assert r.node.pages == [0] and r.node.key == [0, 1, 2, 3]
    (child,) = r.node.children.values()
    assert child.pages == [1, 2] and child.key == list(range(4, 12))
    assert child.hashes == hash_blocks(a, 4)[1:] and r.node.hashes == hash_blocks(a, 4)[:1]
    assert cache.total_tokens == 12
    cache.check_integrity(held_pages=[])
    # Locking the split prefix protects 4 tokens; the suffix stays evictable.
    cache.lock(r.node)
    assert cache.protected_tokens == 4 and cache.evictable_tokens == 8
    cache.check_integrity()
    assert cache.evict(10) == 2
    assert alloc.is_free(1) and alloc.is_free(2) and not alloc.is_free(0)
    cache.unlock(r.node)
    assert cache.protected_tokens == 0 and cache.evictable_tokens == 4
    cache.check_integrity(held_pages=[])


def test_lock_handle_stays_valid_after_later_splits():
    cache, alloc = new_cache(4, num_pages=16)
    a = list(range(16))  # pages [0, 1, 2, 3]
    put(cache, alloc, a)
    h = cache.match_prefix(a).node
    cache.lock(h)
    cache.lock(h)  # counted twice
    assert cache.protected_tokens == 16 and cache.evictable_tokens == 0
    # Two later matches split h's node twice; h keeps the deepest suffix.
    assert cache.match_prefix(a[:9]).pages == [0, 1]
    assert cache.match_prefix(a[:4] + [77, 77, 77, 77]).pages == [0]
    assert h.pages == [2, 3]
    assert h.parent.pages == [1] and h.parent.parent.pages == [0]
    assert h.parent.lock_ref == 2 and h.parent.parent.lock_ref == 2
    assert cache.protected_tokens == 16
    cache.check_integrity()
    assert cache.evict(10) == 0  # all locked
    # A sibling under the locked path is evictable and goes; the locked path does not.
    put(cache, alloc, a[:8] + [5, 5, 5, 5])
    assert cache.evictable_tokens == 4
    assert cache.evict(10) == 1
    cache.unlock(h)
    assert cache.protected_tokens == 16 and cache.evictable_tokens == 0
    cache.unlock(h)
    assert cache.protected_tokens == 0 and cache.evictable_tokens == 16
    cache.check_integrity(held_pages=[])
    with pytest.raises(ValueError, match="not locked"):
        cache.unlock(h)
    # Now evictable: the suffix first, then its parents, down to nothing.
    assert cache.evict(2) == 2
    assert alloc.is_free(2) and alloc.is_free(3) and not alloc.is_free(1)
    assert cache.evict(2) == 2
    assert cache.total_tokens == 0 and alloc.num_free == 16
    cache.check_integrity(held_pages=[])


def test_split_while_locked_by_insert():
    cache, alloc = new_cache(4, num_pages=16)
    a = list(range(12))
    put(cache, alloc, a)
    h = cache.match_prefix(a).node
    cache.lock(h)
    # An insert that diverges inside h's node splits it; the lock count carries over.
    assert put(cache, alloc, a[:4] + [9] * 8) == [4, 5]
    assert cache.protected_tokens == 12 and cache.evictable_tokens == 8
    cache.check_integrity()
    cache.unlock(h)
    assert cache.protected_tokens == 0 and cache.evictable_tokens == 20
    cache.check_integrity(held_pages=[])


def test_root_handle_lock_unlock_is_a_no_op():
    cache, _ = new_cache(4)
    r = cache.match_prefix([1, 2, 3, 4])
    assert r.node.is_root
    cache.lock(r.node)
    assert cache.protected_tokens == 0
    cache.unlock(r.node)
    cache.check_integrity()


@pytest.mark.parametrize("P", [1, 4, 16])
def test_page_sizes_match_is_page_aligned_and_exact(P):
    rng = random.Random(P)
    cache, alloc = new_cache(P, num_pages=4096)
    stored: dict[tuple, int] = {}  # every cached page-aligned prefix -> its page id
    seqs = []
    for _ in range(30):
        base = rng.choice(seqs) if seqs and rng.random() < 0.7 else []
        toks = list(base[: rng.randrange(len(base) + 1)])
        toks += [rng.randrange(3) for _ in range(rng.randrange(1, 5 * P + P))]
        n_full = len(toks) // P
        cached_before = max(
            (k for k in range(n_full + 1) if k == 0 or tuple(toks[: k * P]) in stored), default=0
        )
        adopted = put(cache, alloc, toks)
        assert len(adopted) == n_full - cached_before
        for i, page in enumerate(adopted):
            stored[tuple(toks[: (cached_before + i + 1) * P])] = page
        seqs.append(toks)
        cache.check_integrity(held_pages=[])
    for _ in range(200):
        base = rng.choice(seqs)
        q = base[: rng.randrange(len(base) + 1)] + [
            rng.randrange(3) for _ in range(rng.randrange(P + 3))
        ]
        r = cache.match_prefix(q)
        assert r.num_tokens % P == 0 and r.num_tokens == len(r.pages) * P
        k = 0
        while (k + 1) * P <= len(q) and tuple(q[: (k + 1) * P]) in stored:
            k += 1
        assert r.num_tokens == k * P
        assert r.pages == [stored[tuple(q[: (i + 1) * P])] for i in range(k)]
    assert cache.total_tokens == len(stored) * P
    cache.check_integrity(held_pages=[])


def test_extra_key_isolation():
    cache, alloc = new_cache(4, num_pages=16)
    toks = list(range(8))
    assert put(cache, alloc, toks, extra_key="lora-a") == [0, 1]
    assert cache.match_prefix(toks).pages == []
    assert cache.match_prefix(toks, extra_key="lora-b").pages == []
    assert cache.match_prefix(toks, extra_key="lora-a").pages == [0, 1]
    # The same tokens under no key are a separate entry with their own pages.
    assert put(cache, alloc, toks) == [2, 3]
    assert cache.match_prefix(toks).pages == [2, 3]
    assert cache.match_prefix(toks, extra_key="lora-a").pages == [0, 1]
    assert sorted(cache.all_block_hashes()) == sorted(
        hash_blocks(toks, 4) + hash_blocks(toks, 4, extra_key="lora-a")
    )
    assert cache.total_tokens == 16
    cache.check_integrity(held_pages=[])


def test_insert_return_value_and_duplicate_pages():
    cache, alloc = new_cache(4, num_pages=16)
    toks = list(range(12))
    # Two requests computed the same prompt in parallel, each with private pages.
    r1, r2 = alloc.alloc(3), alloc.alloc(3)
    assert (r1, r2) == ([0, 1, 2], [3, 4, 5])
    assert cache.insert(toks, r1) == 0
    assert cache.insert(toks, r2) == 12  # all already cached: r2's pages are duplicates
    cache.check_integrity(held_pages=r2)
    alloc.free(r2)
    assert cache.match_prefix(toks).pages == [0, 1, 2]
    # Partial overlap: the first two pages are cached, the third is new and adopted.
    other = toks[:8] + [7, 7, 7, 7, 7, 7]  # 3 full pages + 2 tokens
    r3 = alloc.alloc(4)
    assert cache.insert(other, r3) == 8
    dup, adopted, tail = r3[:2], r3[2:3], r3[3:]
    cache.check_integrity(held_pages=dup + tail)
    alloc.free(dup + tail)
    assert cache.match_prefix(other).pages == [0, 1] + adopted
    # A prefix of a cached edge is fully cached (and splits the edge).
    r4 = alloc.alloc(1)
    assert cache.insert(toks[:4], r4) == 4
    alloc.free(r4)
    assert cache.total_tokens == 16
    # Fewer tokens than a page: nothing to cache.
    assert cache.insert([1, 2], []) == 0
    with pytest.raises(ValueError, match="need 3 pages"):
        cache.insert(toks, [8, 9])
    cache.check_integrity(held_pages=[])


def test_matched_pages_are_the_callers_prefix_in_insert():
    # The scheduler's protocol: match, lock, allocate the rest, insert matched + private pages.
    cache, alloc = new_cache(4, num_pages=16)
    put(cache, alloc, list(range(8)))
    toks = list(range(14))  # 3 full pages + 2
    m = cache.match_prefix(toks)
    cache.lock(m.node)
    private = alloc.alloc(2)
    assert m.pages == [0, 1] and private == [2, 3]
    assert cache.insert(toks, m.pages + private) == 8
    cache.unlock(m.node)
    cache.check_integrity(held_pages=[3])  # the partial tail page stays with the caller
    alloc.free([3])
    assert cache.match_prefix(toks).pages == [0, 1, 2]


def _three_leaves(eviction):
    """Three disjoint 2-page sequences inserted in order: a=[0,1], b=[2,3], c=[4,5]."""
    cache, alloc = new_cache(4, num_pages=16, eviction=eviction)
    seqs = {name: [i] * 8 for i, name in enumerate("abc", start=1)}
    for name in "abc":
        put(cache, alloc, seqs[name])
    return cache, alloc, seqs


def _evicted_pages(alloc, before):
    return sorted(set(alloc.free_pages()) - before)


def test_lru_evicts_the_least_recently_matched_leaf_first():
    cache, alloc, s = _three_leaves("lru")
    cache.match_prefix(s["a"])  # a is now the most recent; b is the oldest
    order = []
    for _ in range(3):
        before = set(alloc.free_pages())
        assert cache.evict(2) == 2
        order.append(_evicted_pages(alloc, before))
        cache.check_integrity(held_pages=[])
    assert order == [[2, 3], [4, 5], [0, 1]]


def test_lru_within_a_shared_prefix():
    cache, alloc = new_cache(4, num_pages=16)
    base = list(range(8))
    (p0, p1, x1) = put(cache, alloc, base + [1] * 4)
    (x2,) = put(cache, alloc, base + [2] * 4)  # shares the first two pages
    (x3,) = put(cache, alloc, base + [3] * 4)
    cache.match_prefix(base + [1] * 4)
    cache.match_prefix(base + [2] * 4)  # the [3] leaf is now the least recently used
    before = set(alloc.free_pages())
    assert cache.evict(1) == 1
    assert _evicted_pages(alloc, before) == [x3]
    before = set(alloc.free_pages())
    assert cache.evict(1) == 1
    assert _evicted_pages(alloc, before) == [x1]
    before = set(alloc.free_pages())
    # The shared prefix is not a leaf until its last child is gone.
    assert cache.evict(2) == 3
    assert _evicted_pages(alloc, before) == sorted([p0, p1, x2])
    cache.check_integrity(held_pages=[])


def test_lfu_evicts_the_least_used_leaf_first():
    cache, alloc, s = _three_leaves("lfu")
    for _ in range(3):
        cache.match_prefix(s["a"])  # a: 3 hits, but the least recent of all
    for _ in range(2):
        cache.match_prefix(s["c"])  # c: 2 hits
    cache.match_prefix(s["b"])  # b: 1 hit, the most recent
    order = []
    for _ in range(3):
        before = set(alloc.free_pages())
        assert cache.evict(1) == 2
        order.append(_evicted_pages(alloc, before))
    assert order == [[2, 3], [4, 5], [0, 1]]
    cache.check_integrity(held_pages=[])


def test_lfu_ties_break_by_recency():
    cache, alloc, s = _three_leaves("lfu")
    cache.match_prefix(s["c"])
    cache.match_prefix(s["a"])
    cache.match_prefix(s["b"])  # one hit each: oldest access goes first
    order = []
    for _ in range(3):
        before = set(alloc.free_pages())
        cache.evict(1)
        order.append(_evicted_pages(alloc, before))
    assert order == [[4, 5], [0, 1], [2, 3]]


@pytest.mark.parametrize("eviction", ["lru", "lfu"])
def test_locked_paths_survive_any_eviction(eviction):
    cache, alloc = new_cache(4, num_pages=32, eviction=eviction)
    base = list(range(8))
    put(cache, alloc, base + [1] * 8)  # 0 1 | 2 3
    put(cache, alloc, base + [2] * 8)  # shared | 4 5
    put(cache, alloc, [9] * 12)  # 6 7 8
    m = cache.match_prefix(base + [1] * 8)
    cache.lock(m.node)
    inner = cache.match_prefix(base + [2] * 3).node  # the shared prefix only
    cache.lock(inner)
    assert cache.protected_tokens == 16 and cache.evictable_tokens == 20
    assert cache.evict(1000) == 5
    assert cache.evictable_tokens == 0 and cache.total_tokens == 16
    assert cache.match_prefix(base + [1] * 8).pages == [0, 1, 2, 3]
    assert cache.match_prefix(base + [2] * 8).pages == [0, 1]
    assert cache.match_prefix([9] * 12).pages == []
    cache.check_integrity(held_pages=[])
    cache.unlock(m.node)
    assert cache.evictable_tokens == 8 and cache.protected_tokens == 8
    assert cache.evict(1000) == 2
    assert cache.match_prefix(base).pages == [0, 1]
    cache.unlock(inner)
    assert cache.protected_tokens == 0
    assert cache.evict(1000) == 2 and cache.total_tokens == 0 and alloc.num_free == 32
    cache.check_integrity(held_pages=[])


def test_evict_frees_only_the_shortfall():
    cache, alloc = new_cache(4, num_pages=64)
    for i in range(6):  # six one-page leaves
        put(cache, alloc, [i] * 4)
    assert cache.evict(0) == 0 and cache.evict(-3) == 0
    assert cache.evict(2) == 2 and cache.total_tokens == 16
    assert cache.evict(3) == 3 and cache.total_tokens == 4
    assert cache.evict(5) == 1  # fewer evictable than asked: all of it
    assert cache.evict(5) == 0
    # Three-page leaves: asking for one page frees one whole leaf (overshoot < one leaf).
    for i in range(3):
        put(cache, alloc, [10 + i] * 12)
    assert cache.evict(1) == 3 and cache.total_tokens == 24
    assert cache.evict(4) == 6 and cache.total_tokens == 0
    cache.check_integrity(held_pages=[])


def test_reset_and_reset_while_locked():
    cache, alloc = new_cache(4, num_pages=16, enable_events=True)
    put(cache, alloc, list(range(8)))
    put(cache, alloc, [5] * 12)
    m = cache.match_prefix(list(range(8)))
    cache.lock(m.node)
    cache.take_events()
    with pytest.raises(RuntimeError, match="locked"):
        cache.reset()
    # Nothing changed.
    assert cache.total_tokens == 20 and cache.protected_tokens == 8 and alloc.num_free == 11
    assert cache.take_events() == []
    cache.check_integrity(held_pages=[])
    cache.unlock(m.node)
    cache.reset()
    assert cache.total_tokens == 0 and cache.evictable_tokens == 0 and alloc.num_free == 16
    assert cache.match_prefix(list(range(8))).pages == []
    assert cache.all_block_hashes() == []
    cache.check_integrity(held_pages=[])
    # The cache works after a reset.
    adopted = put(cache, alloc, list(range(8)))
    assert len(adopted) == 2 and cache.match_prefix(list(range(8))).pages == adopted
    cache.check_integrity(held_pages=[])


def test_check_integrity_catches_a_leak_and_a_double_owner():
    cache, alloc = new_cache(4, num_pages=8)
    put(cache, alloc, list(range(8)))  # pages 0, 1 cached
    leaked = alloc.alloc(1)
    with pytest.raises(AssertionError, match="page leak"):
        cache.check_integrity(held_pages=[])
    cache.check_integrity(held_pages=leaked)
    with pytest.raises(AssertionError, match="held by a request and cached"):
        cache.check_integrity(held_pages=leaked + [0])


def test_make_cache_registry():
    alloc = PageAllocator(4)
    assert isinstance(make_cache("radix", 4, alloc, eviction="lfu"), RadixCache)
    with pytest.raises(ValueError, match="chunk"):
        make_cache("nope", 4, alloc)
    with pytest.raises(ValueError, match="eviction"):
        RadixCache(4, alloc, eviction="fifo")
    with pytest.raises(ValueError, match="page_size"):
        RadixCache(3, alloc)


def test_the_tree_takes_tuples_as_well_as_lists():
    # Edge keys are lists; a tuple query must still match whole edges (a tuple slice never
    # equals a list, which would have matched one page per edge and split every node).
    cache, alloc = new_cache(4, num_pages=16)
    a = list(range(12))
    put(cache, alloc, a)
    pages, node = cache._tree.match(tuple(a))
    assert pages == [0, 1, 2] and node.key == a
    assert sum(1 for _ in cache._tree.iter_nodes()) == 1  # still one node: nothing split
    assert cache.match_prefix(tuple(a)).num_tokens == 12
