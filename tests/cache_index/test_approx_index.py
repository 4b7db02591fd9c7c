import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixray.cache_index import (
    AllBlocksCleared,
    ApproxIndex,
    BlockRemoved,
    BlockStored,
    EventBatch,
    hash_blocks,
)

from .helpers import CACHE_SETTINGS


class _CountingDict(dict):
    """The owners map with its lookups counted (to show match walks the query once)."""

    gets = 0

    def get(self, *args):
        _CountingDict.gets += 1
        return super().get(*args)


def test_match_counts_every_worker_in_one_walk():
    idx = ApproxIndex(16)
    h = [101, 102, 103, 104]  # stands for a chain of block hashes
    idx.insert("w0", h)
    idx.insert("w1", h[:2])
    idx.insert("w2", [h[0], h[2], h[3]])  # lacks h1: only its first block matches
    idx.insert("w3", [999])
    idx._owners = _CountingDict(idx._owners)
    _CountingDict.gets = 0
    assert idx.match(h) == {"w0": 4, "w1": 2, "w2": 1}
    assert _CountingDict.gets <= len(h)
    assert idx.match(h[:1]) == {"w0": 1, "w1": 1, "w2": 1}
    assert idx.match([999, 101]) == {"w3": 1}
    assert idx.match([5, 101]) == {}
    assert idx.match([]) == {}


def test_match_stops_early_when_nobody_holds_the_prefix():
    idx = ApproxIndex(16)
    idx.insert("w", [1, 2])
    idx._owners = _CountingDict(idx._owners)
    _CountingDict.gets = 0
    assert idx.match([1, 7] + list(range(1000, 2000))) == {"w": 1}
    assert _CountingDict.gets == 2


def test_lru_bound_trims_chains_tail_first():
    idx = ApproxIndex(16, max_blocks_per_worker=4)
    a, b = [1, 2, 3], [4, 5, 6]
    idx.insert("w", a)
    idx.insert("w", b)  # 6 > 4: the two oldest go, and those are a's deepest blocks
    assert idx.num_blocks("w") == 4 and idx.trimmed_blocks == 2
    assert idx.blocks("w") == {1, 4, 5, 6}
    assert idx.match(a) == {"w": 1} and idx.match(b) == {"w": 3}
    # Re-inserting refreshes: now b's tail is the oldest.
    idx.insert("w", a[:1])
    idx.insert("w", [7])
    assert idx.blocks("w") == {1, 4, 5, 7}
    assert idx.match(b) == {"w": 2}
    # The bound is per worker.
    idx.insert("v", list(range(100, 104)))
    assert idx.num_blocks("v") == 4 and idx.num_blocks("w") == 4 and idx.num_blocks() == 8


def test_below_the_bound_lookups_are_exact():
    idx = ApproxIndex(4, max_blocks_per_worker=1000)
    toks = list(range(64))
    h = hash_blocks(toks, 4)
    idx.insert(0, h[:10])
    idx.insert(1, h)
    assert idx.match(h) == {0: 10, 1: 16}
    assert idx.trimmed_blocks == 0


def test_remove_clear_and_remove_worker():
    idx = ApproxIndex(16)
    idx.insert("a", [1, 2, 3])
    idx.insert("b", [1, 2, 3])
    idx.remove("a", [2, 99])
    assert idx.match([1, 2, 3]) == {"a": 1, "b": 3}
    assert idx.blocks("a") == {1, 3}
    idx.remove("nobody", [1])  # unknown worker: nothing happens
    idx.clear("b")
    assert idx.workers() == ["a", "b"] and idx.num_blocks("b") == 0
    assert idx.match([1, 2, 3]) == {"a": 1}
    idx.insert("b", [1, 2])
    idx.remove_worker("a")
    assert idx.workers() == ["b"] and idx.num_blocks("a") == 0
    assert idx.match([1, 2, 3]) == {"b": 2}
    # A new worker reuses a's slot but none of its entries.
    idx.insert("c", [50])
    assert idx.match([1, 2, 3]) == {"b": 2} and idx.match([3]) == {}
    assert idx.num_distinct_blocks() == 3
    idx.remove_worker("nobody")
    idx.remove_worker("b")
    idx.remove_worker("c")
    assert idx.num_distinct_blocks() == 0 and idx.workers() == []


def test_memory_bytes_grows_and_shrinks():
    idx = ApproxIndex(16)
    empty = idx.memory_bytes()
    idx.insert("a", range(1 << 40, (1 << 40) + 5000))
    one = idx.memory_bytes()
    idx.insert("b", range(1 << 41, (1 << 41) + 5000))
    two = idx.memory_bytes()
    assert empty < one < two
    assert one - empty >= 5000 * 8  # at least the hashes themselves
    idx.remove("b", range(1 << 41, (1 << 41) + 5000))  # evicted: remembered as lost
    ghost = idx.lost.memory_bytes()
    assert ghost >= 5000 * 8 and idx.memory_bytes() - ghost < two  # b's entries are gone
    idx.clear("a")  # a restart: nothing lost
    assert idx.memory_bytes() - ghost < one and idx.lost.memory_bytes() == ghost
    assert idx.stats()["entries"] == 0


def test_apply_events_and_batches():
    idx = ApproxIndex(4)
    idx.apply("w", [BlockStored([1, 2, 3], None, list(range(12)), 4), BlockRemoved([3])])
    assert idx.blocks("w") == {1, 2}
    idx.apply("w", EventBatch("w", 1, 0.0, [BlockStored([4], 2, [0] * 4, 4)]))
    assert idx.match([1, 2, 4]) == {"w": 3}
    idx.apply("w", [AllBlocksCleared()])
    assert idx.blocks("w") == set() and idx.match([1]) == {}
    with pytest.raises(TypeError, match="not a KV event"):
        idx.apply("w", ["BlockStored"])


def test_bad_arguments():
    with pytest.raises(ValueError, match="max_blocks_per_worker"):
        ApproxIndex(16, max_blocks_per_worker=0)
    with pytest.raises(ValueError, match="page_size"):
        ApproxIndex(6)


@CACHE_SETTINGS
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["ins", "rm", "clear"]),
            st.integers(0, 3),
            st.lists(st.integers(0, 12), max_size=6),
        ),
        max_size=40,
    ),
    st.lists(st.integers(0, 12), max_size=8),
)
def test_match_agrees_with_per_worker_sets(ops, query):
    """Below the bound the index is exact: match == leading hits against each worker's set."""
    idx = ApproxIndex(16, max_blocks_per_worker=10_000)
    model: dict[int, set[int]] = {}
    for op, w, hs in ops:
        if op == "ins":
            idx.insert(w, hs)
            model.setdefault(w, set()).update(hs)
        elif op == "rm":
            idx.remove(w, hs)
            model.get(w, set()).difference_update(hs)
        else:
            idx.clear(w)
            model.get(w, set()).clear()
    expected = {}
    for w, held in model.items():
        n = 0
        while n < len(query) and query[n] in held:
            n += 1
        if n:
            expected[w] = n
        assert idx.blocks(w) == held
    assert idx.match(query) == expected
    assert idx.num_blocks() == sum(len(s) for s in model.values())


@CACHE_SETTINGS
@given(st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=8), max_size=20))
def test_lru_bound_is_never_exceeded(chains):
    idx = ApproxIndex(16, max_blocks_per_worker=7)
    for chain in chains:
        idx.insert("w", chain)
        assert idx.num_blocks("w") <= 7
        assert set(idx._owners) == idx.blocks("w")


def test_host_tier_entries_are_their_own():
    """A demotion (host store, then device remove) keeps the prefix reusable on that worker:
    ``match`` (device only) drops it, ``match_tiers`` keeps it as a load; a load-back (device
    store, no host remove) makes it a device hit again; a host eviction drops only the host
    copy."""
    idx = ApproxIndex(16)
    chain = [11, 12, 13, 14]
    idx.apply("w0", [BlockStored(chain, None, list(range(64)), 16)])
    idx.apply("w1", [BlockStored(chain[:2], None, list(range(32)), 16)])
    assert idx.match_tiers(chain) == {"w0": (4, 4), "w1": (2, 2)}
    # w0 demotes its last two blocks: host store first, then the device remove
    idx.apply("w0", [BlockStored(chain[2:], 12, list(range(32, 64)), 16, "CPU")])
    idx.apply("w0", [BlockRemoved(chain[2:], "GPU")])
    assert idx.match(chain) == {"w0": 2, "w1": 2}
    assert idx.match_tiers(chain) == {"w0": (2, 4), "w1": (2, 2)}
    assert idx.num_blocks("w0") == 2 and idx.num_blocks("w0", tier="host") == 2
    # a load-back: device store, the host copy stays
    idx.apply("w0", [BlockStored(chain[2:3], 12, list(range(32, 48)), 16)])
    assert idx.match_tiers(chain)["w0"] == (3, 4)
    # the host tier evicts a block the device also holds: the device copy stays
    idx.apply("w0", [BlockRemoved(chain[2:3], "CPU")])
    assert idx.match_tiers(chain)["w0"] == (3, 4)
    idx.apply("w0", [BlockRemoved(chain[3:], "CPU")])
    assert idx.match_tiers(chain)["w0"] == (3, 3)
    assert idx.stats()["host_entries"] == 0
    idx.apply("w0", [BlockStored([99], None, list(range(16)), 16, "CPU"), AllBlocksCleared()])
    assert idx.num_blocks("w0", tier="host") == 0 and "w0" not in idx.match_tiers(chain)
    with pytest.raises(ValueError, match="tier must be one of"):
        idx.insert("w0", [1], tier="disk")


@CACHE_SETTINGS
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["ins", "rm", "clear"]),
            st.sampled_from(["device", "host"]),
            st.integers(0, 3),
            st.lists(st.integers(0, 12), max_size=6),
        ),
        max_size=40,
    ),
    st.lists(st.integers(0, 12), max_size=8),
)
def test_match_tiers_agrees_with_per_worker_sets(ops, query):
    """Below the bound: each worker's (device prefix, prefix over both tiers) equals the leading
    hits against its device set and against the union of its two sets."""
    idx = ApproxIndex(16, max_blocks_per_worker=10_000)
    model: dict[tuple[int, str], set[int]] = {}
    for op, tier, w, hs in ops:
        if op == "ins":
            idx.insert(w, hs, tier)
            model.setdefault((w, tier), set()).update(hs)
        elif op == "rm":
            idx.remove(w, hs, tier)
            model.get((w, tier), set()).difference_update(hs)
        else:
            idx.clear(w)
            for t in ("device", "host"):
                model.get((w, t), set()).clear()

    def lead(held: set[int]) -> int:
        n = 0
        while n < len(query) and query[n] in held:
            n += 1
        return n

    expected = {}
    for w in range(4):
        device = model.get((w, "device"), set())
        both = device | model.get((w, "host"), set())
        if lead(both):
            expected[w] = (lead(device), lead(both))
        assert idx.blocks(w, "host") == model.get((w, "host"), set())
    assert idx.match_tiers(query) == expected
