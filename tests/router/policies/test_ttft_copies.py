"""ttft's two rules about copies of a prefix (docs/ttft_policy.md): moving a request off the only
worker that holds its prefix leaves that copy stale, which costs cache room once the fleet's
caches are full (the ``recompute`` term's ``stale`` share); a header that a quarter of the
workers hold counts as held by an idle worker that lacks it, so the workers still without it
are not kept out of new conversations."""

from __future__ import annotations

import pytest

from radixray.router.policies import RoutingRequest, WorkerState, make_policy
from radixray.router.policies.ttft import TERMS

from .test_policies import P, index_with

WAIT, PREFILL, LOAD, RECOMPUTE, EVICT, DECODE = range(6)


def req(k: int = 0) -> RoutingRequest:
    return RoutingRequest(k, 8 * P, list(range(1000, 1008)), None)


def worker(wid, queued=0, running=0, free=0):
    return WorkerState(
        wid,
        running=running,
        queued_prefill_tokens=queued,
        free_pages=free,
        total_pages=100,
        prefill_tokens_per_s=100.0,
        decode_step_s=0.0,
    )


def test_ttft_prices_the_stale_copy_a_move_leaves_when_caches_are_full():
    """Worker 1 alone holds 6 of the 8 pages, behind 200 queued tokens; every cache is full.
    With the reuse share h at 0.75 (96 of 128 tokens found cached, arrival after arrival) and
    L = 0, at 100 tokens/s: staying costs wait 2.00 + prefill 0.32 + evict 0.75 * 32 * 0.01 =
    0.24, 2.56 s; moving to an empty queue prefill 1.28 + evict 0.75 * 1.28 = 0.96, plus the
    stale copy left on worker 1, recompute (0 + h * 1.0 of the pages in use) * 96 * 0.01 =
    0.72: 2.96 s, and it stays. Without the stale copy's 0.72 s the move (2.24 s) would win.
    With free pages everywhere the stale copy costs nothing (recompute 0) and it moves."""
    idx = index_with(w1=6)
    full = [worker(0), worker(1, queued=200, running=1), worker(2), worker(3)]
    policy = make_policy("ttft", reuse_weight=0.0)
    for k in range(1000):
        d = policy.choose(req(k), full, idx)
    h = policy.reuse
    assert abs(h - 0.75) < 1e-6
    assert d.worker_id == 1 and d.reason == "ttft: best match"
    assert d.term_names == TERMS
    assert d.terms[1] == pytest.approx((2.0, 0.32, 0, 0, h * 0.32, 0), abs=1e-9)
    assert d.terms[0] == pytest.approx((0, 1.28, 0, h * 0.96, h * 1.28, 0), abs=1e-9)
    assert abs(d.terms[0][RECOMPUTE] - 0.72) < 1e-6  # 0.75 * 96 / 100
    assert abs(d.scores[1] - (232 + 32 * h) / 100) < 1e-9  # 2.56 s
    assert abs(d.scores[0] - (128 + 128 * h + 96 * h) / 100) < 1e-9  # 2.96 s
    assert d.scores[0] - d.terms[0][RECOMPUTE] < d.scores[1]  # the stale copy keeps it there
    assert d.decided_by == "prefill"  # 0.96 s more prefill elsewhere, the largest gap
    # Caches with room: nothing is evicted, nothing goes stale that costs room; it moves.
    roomy = [worker(0, free=100), worker(1, 200, 1, free=100), worker(2, free=100)]
    d = policy.choose(req(), roomy, idx)
    assert d.worker_id in (0, 2)
    assert d.terms[0] == pytest.approx((0, 1.28, 0, 0, 0, 0), abs=1e-12)
    assert d.terms[0][RECOMPUTE] == 0.0 and d.terms[0][EVICT] == 0.0
    assert d.decided_by == "tie"  # workers 0 and 2 cost the same


def test_ttft_an_idle_worker_counts_a_header_most_workers_hold_as_held():
    """Workers 0, 1 and 2 hold a 4-page header of the 8-page prompt, each behind 30 queued
    tokens; worker 3 is idle and has never seen it. Counted as held there, it costs 64 tokens
    (0.64 s, no recompute term) against 30 + 64 (0.94 s): new conversations go to it, and the
    queue is what separates them. Held by two workers of four (more than a quarter) the same; by
    one, it is that worker's own (a conversation's history); and on a busy worker 3 the header
    is its own to compute (prefill 1.28 s and its recompute term)."""
    fleet = [worker(w, 30, 1, 100) for w in range(3)] + [worker(3, 0, 0, 100)]
    idx = index_with(w0=4, w1=4, w2=4)
    d = make_policy("ttft").choose(req(), fleet, idx)
    assert d.worker_id == 3 and abs(d.scores[3] - 0.64) < 1e-9
    assert abs(d.scores[0] - 0.94) < 1e-9
    assert d.terms[3] == pytest.approx((0, 0.64, 0, 0, 0, 0), abs=1e-12)
    assert d.terms[0] == pytest.approx((0.30, 0.64, 0, 0, 0, 0), abs=1e-9)
    assert d.decided_by == "wait"
    assert d.predicted_cached_tokens == 0  # what the chosen worker holds, reported as it is
    one = index_with(w0=4)  # one holder: a conversation's own history, not a shared header
    assert make_policy("ttft").choose(req(), fleet, one).worker_id == 0
    two = index_with(w0=4, w1=4)  # two of four: more than a quarter, shared
    assert make_policy("ttft").choose(req(), fleet, two).worker_id == 3
    # the majority rule before (shared_share=0.5): two of four are theirs
    majority = make_policy("ttft", shared_share=0.5)
    assert majority.choose(req(), fleet, two).worker_id in (0, 1)
    assert majority.choose(req(), fleet, idx).worker_id == 3
    # the header on a busy worker that lacks it is still its own to compute
    busy = [*fleet[:3], worker(3, 0, 1, 100)]
    d = make_policy("ttft").choose(req(), busy, idx)
    assert d.worker_id in (0, 1, 2)
    assert abs(d.terms[3][PREFILL] - 1.28) < 1e-9 and d.terms[3][RECOMPUTE] > 0
