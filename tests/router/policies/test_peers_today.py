"""The simulated peers decide as their current code does, on small cases worked out by hand from
that code (the arithmetic is in each test's comments).

- ``kv_cost``: NVIDIA Dynamo's KV router, ai-dynamo/dynamo commit 2a6da14c (2026-08-21,
  workspace 1.5.0; 1.6.1's defaults are the same): the cost in
  ``lib/kv-router/src/scheduling/selector.rs``, the active-block booking in
  ``lib/kv-router/src/sequences/``.
- ``cache_aware`` and ``cache_aware_events``: SGLang's gateway smg 1.13.0 (PyPI sdist):
  ``model_gateway/src/policies/cache_aware.rs`` (candidates, spill gate, event mode),
  ``policies/least_load.rs`` and ``worker/expected_wait.rs`` (the final pick).
"""

from __future__ import annotations

import pytest

from radixray.cache_index import ApproxIndex
from radixray.router.policies import Decision, RoutingRequest, WorkerState, make_policy
from radixray.router.policies.smg import expected_wait, spills


def state(wid, running=0, waiting=0, queued=0, decode=0, pages=100, step=0.0):
    return WorkerState(
        worker_id=wid,
        running=running,
        waiting=waiting,
        queued_prefill_tokens=queued,
        active_decode_tokens=decode,
        free_pages=pages,
        total_pages=pages,
        decode_step_s=step,
    )


def index(page_size: int, workers: int, **held) -> ApproxIndex:
    idx = ApproxIndex(page_size, 1 << 12)
    for w in range(workers):
        idx.add_worker(w)
    for name, hashes in held.items():
        idx.insert(int(name[1:]), hashes)
    return idx


# ------------------------------------------------------------------ Dynamo


def test_dynamo_counts_only_the_blocks_not_already_active_on_a_worker():
    # Block size 4. Worker A (0) runs a request of blocks [h1, h2, h3], past its prefill, and
    # its cache holds [h1, h2]. A new 12-token request, blocks [h1, h2, h4]:
    #   A: prefill 12/4 - overlap 2 = 1; decode 3 active + 1 new (h4) = 4 -> cost 5
    #   B: prefill 12/4 - 0 = 3;         decode 0 active + 3 new      = 3 -> cost 6   -> A
    # Without assuming reuse every block is new: A decode 3 + 3 = 6 -> 7; B 6 -> B.
    h1, h2, h3, h4 = 11, 12, 13, 14
    workers = [state(0), state(1)]
    for reuse, costs, winner in ((True, {0: 5.0, 1: 6.0}, 0), (False, {0: 7.0, 1: 6.0}, 1)):
        pol = make_policy("kv_cost", assume_kv_reuse=reuse)
        idx = index(4, 2)
        running = RoutingRequest("r0", 12, [h1, h2, h3])
        pol.on_dispatch(pol.choose(running, [workers[0]], idx), running)
        pol.on_first_token("r0", 0)
        idx.insert(0, [h1, h2])  # what A's cache holds (from its KV events)
        d = pol.choose(RoutingRequest("r1", 12, [h1, h2, h4]), workers, idx)
        assert d.scores == costs and d.worker_id == winner


def test_dynamo_books_prefill_until_the_first_token_and_blocks_until_the_end():
    # Block size 4; both workers idle and empty. r0 (8 tokens, [1, 2]) goes to worker 0 (tie,
    # seeded) and books 8 prefill tokens and 2 blocks there. For r1 (8 tokens, [3, 4]):
    #   w0: prefill (8 + 8)/4 = 4, decode 2 + 2 = 4 -> 8; w1: 2 + 2 = 4.
    # After r0's first token: w0 prefill 8/4 = 2, decode 4 -> 6. After r0 ends: 4, as w1.
    pol = make_policy("kv_cost", seed=0)
    idx = index(4, 2)
    workers = [state(0), state(1)]
    r0, r1 = RoutingRequest("r0", 8, [1, 2]), RoutingRequest("r1", 8, [3, 4])
    d0 = pol.choose(r0, workers, idx)
    pol.on_dispatch(d0, r0)
    w, other = d0.worker_id, 1 - d0.worker_id
    assert pol.choose(r1, workers, idx).scores == {w: 8.0, other: 4.0}
    pol.on_first_token("r0", w)
    assert pol.choose(r1, workers, idx).scores == {w: 6.0, other: 4.0}
    pol.on_complete("r0", w, 0)
    assert pol.choose(r1, workers, idx).scores == {w: 4.0, other: 4.0}
    # a request sharing r0's blocks while r0 runs adds none of them: [1, 2, 5] -> 1 new block
    pol.on_dispatch(d0, r0)
    pol.on_first_token("r0", w)
    shared = RoutingRequest("r2", 12, [1, 2, 5])
    assert pol.choose(shared, workers, idx).scores[w] == 12 / 4 + 2 + 1


def test_dynamo_prefill_load_scale_and_credit():
    # One worker, block size 4, a 16-token request of which 2 blocks are cached there:
    # prefill max(0, 16/4 - credit * 2), decode 4 new blocks.
    idx = index(4, 1, w0=[1, 2])
    r = RoutingRequest("r", 16, [1, 2, 3, 4])
    assert make_policy("kv_cost").choose(r, [state(0)], idx).scores == {0: 2.0 + 4}
    scaled = make_policy("kv_cost", prefill_load_scale=2.0, overlap_score_credit=0.0)
    assert scaled.choose(r, [state(0)], idx).scores == {0: 2 * 4.0 + 4}
    with pytest.raises(ValueError, match="prefill_load_scale must be >= 0"):
        make_policy("kv_cost", prefill_load_scale=-1)


# ------------------------------------------------------------------ smg


def test_smg_spill_gate():
    # avg 5/3: relative bar 2.5, margin min(64, max(ceil(2 * 1.29) = 3, 4)) = 4 -> 5.67: a load
    # of 2 passes. avg 4 (loads 10, 1, 1): bars 6 and 4 + 4 = 8: 10 spills, 7 does not.
    assert not spills(2, 5 / 3, 64, 1.5)
    assert spills(10, 4.0, 64, 1.5) and not spills(7, 4.0, 64, 1.5)
    assert not spills(10, 4.0, 64, 3.0)  # both bars must be passed


def test_smg_expected_wait():
    # queued 800 tokens, 1 running (1,024 tokens) at 2,000 tokens/s (no throughput reported),
    # half the pool held: 1824 / 2000 + 0.15 * 0.5 / 0.5.
    w = state(0, running=1, queued=800, decode=800, pages=100)
    assert expected_wait(w, page_size=16) == pytest.approx(1824 / 2000 + 0.15)
    # no queued tokens reported: 1,024 per waiting request; throughput running / step time
    w = state(0, running=2, waiting=3, step=0.01)
    assert expected_wait(w, page_size=16) == pytest.approx((3 * 1024 + 2 * 1024) / 200)


def _text_policy(seed=0, **kw):
    """smg's text mode, its tree taught that workers 0 and 1 were sent blocks [1..6]."""
    pol = make_policy("cache_aware", seed=seed, **kw)
    idx = index(16, 3)
    first = RoutingRequest("a", 6 * 16, [1, 2, 3, 4, 5, 6])
    for w in (0, 1):
        pol.choose(first, [state(0), state(1), state(2)], idx)
        pol.on_dispatch(Decision(w, "sent"), first)
    return pol, idx


def test_smg_text_mode_matches_its_own_tree_then_least_expected_wait():
    # Loads [2, 2, 1]; 6 of 10 blocks (60% > 30%) held by workers 0 and 1 in smg's tree; nobody
    # gated. Expected waits (no throughput reported): w0 = w1 = 2 * 1024 / 2000 -> a random tie
    # between them, never w2, although w2 is the least loaded and the index holds nothing.
    loads = [state(0, running=2), state(1, running=2), state(2, running=1)]
    r = RoutingRequest("b", 10 * 16, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    picks = set()
    for seed in range(20):
        pol, idx = _text_policy(seed)
        d = pol.choose(r, loads, idx)
        assert d.predicted_cached_tokens == 6 * 16 and d.reason == "cache_aware: match"
        picks.add(d.worker_id)
    assert picks == {0, 1}
    # A low match (2 of 10 blocks, 20% <= 30%): the lowest expected wait over all: w2.
    pol, idx = _text_policy()
    low = RoutingRequest("c", 10 * 16, [1, 2, 30, 31, 32, 33, 34, 35, 36, 37])
    assert pol.choose(low, loads, idx).worker_id == 2


def test_smg_text_tree_forgets_least_recently_used_entries_at_its_size():
    # A tree of 8 blocks' tokens: after [1..6] on w0 and w1 (12 entries) only 8 remain, the
    # least recently used leaves gone first (w0's deepest 4): w0 holds [1, 2], w1 [1..6].
    pol, idx = _text_policy(max_tree_tokens=8 * 16)
    assert pol.match([1, 2, 3, 4, 5, 6]) == (6, {1})
    assert pol.match([1, 2]) == (2, {0, 1})


def test_smg_event_mode_takes_the_deepest_holder_with_no_threshold():
    # Overlaps [4, 4, 0] blocks of 10 (40%, and 1 block would do); loads [2, 2, 1]; worker 0's
    # index holds more blocks than worker 1's (tree size is no tie-break): a random tie.
    held = [1, 2, 3, 4]
    idx = index(16, 3, w0=held + [50, 51, 52, 53, 54, 55], w1=held)
    loads = [state(0, running=2), state(1, running=2), state(2, running=1)]
    r = RoutingRequest("d", 10 * 16, held + [5, 6, 7, 8, 9, 10])
    picks = {
        make_policy("cache_aware_events", seed=s).choose(r, loads, idx).worker_id for s in range(20)
    }
    assert picks == {0, 1}
    one = index(16, 3, w2=[1])
    d = make_policy("cache_aware_events").choose(r, loads, one)
    assert d.worker_id == 2 and d.predicted_cached_tokens == 16


def test_smg_spilled_holder_and_overloaded_workers():
    # The holder (w0) has 10 outstanding against avg 4: it spills; the pick is the lowest
    # expected wait among the rest: w2 (running 1) over w1 (running 1, 600 tokens queued).
    idx = index(16, 3, w0=[1, 2, 3, 4])
    r = RoutingRequest("e", 4 * 16, [1, 2, 3, 4])
    loads = [state(0, running=10), state(1, running=1, queued=600), state(2, running=1)]
    assert make_policy("cache_aware_events").choose(r, loads, idx).worker_id == 2
    # Overload protection: 8 waiting requests leave a worker out while another is under.
    over = [state(0, waiting=8), state(1, running=3), state(2, running=3, waiting=8)]
    assert make_policy("cache_aware_events").choose(r, over, idx).worker_id == 1
    every = [state(0, waiting=8), state(1, waiting=9)]
    assert make_policy("cache_aware_events").choose(r, every, index(16, 2)).worker_id == 0
