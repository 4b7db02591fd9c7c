"""ttft prices the chunk it packs into another request's last prefill step (docs/ttft_policy.md,
"A chunk packed into another's last step"): the engine fills every step's budget, so a prompt
placed behind a prefill that ends mid-step lengthens that step, and the request finishing in it
waits for the whole step."""

from __future__ import annotations

import pytest

from radixray.router.policies import RoutingRequest, WorkerState, make_policy
from radixray.router.policies.costs_to_others import packing_delay

from .test_policies import P, index_with


def _worker(wid, queued, running=0, budget=512, rate=1000.0):
    return WorkerState(
        wid,
        running=running,
        waiting=1 if queued else 0,
        queued_prefill_tokens=queued,
        free_pages=1000,
        total_pages=1000,
        prefill_tokens_per_s=rate,
        max_batch_tokens=budget,
    )


def test_the_delay_is_the_packed_tokens_at_the_fits_rate():
    # 600 queued on a 512 budget: the queue's last step has 424 tokens of room
    assert packing_delay(_worker(0, 600), 600, 1000) == pytest.approx(0.424)
    assert packing_delay(_worker(0, 600), 600, 100) == pytest.approx(0.100)  # all of it fits
    # two decodes take budget first: 510 a step, 600 queued leaves 420
    assert packing_delay(_worker(0, 600, running=2), 600, 1000) == pytest.approx(0.420)
    assert packing_delay(_worker(0, 1024), 1024, 300) == 0.0  # the queue ends on a boundary
    assert packing_delay(_worker(0, 0), 0, 300) == 0.0  # nothing queued: no one is delayed
    assert packing_delay(_worker(0, 600, budget=0), 600, 300) == 0.0  # no budget reported


def _decide(packing: bool):
    """Worker 1 holds 512 of the prompt's 640 tokens behind a 600-token prefill that ends
    mid-step (424 tokens of room in its last step); worker 0 is idle. Myopic costs (reuse weight
    0), the 20% margin, demand off."""
    p = make_policy("ttft", seed=0, reuse_weight=0.0, demand=False, packing=packing)
    request = RoutingRequest(0, 40 * P, list(range(1000, 1040)), None)
    return p.choose(request, [_worker(0, 0), _worker(1, 600)], index_with(w1=32))


def test_the_packed_chunk_tips_a_request_off_a_busy_holder():
    """Without the term the holder's cost (600 queued, then 128 tokens: 0.728 s) is within 20%
    of the idle worker's 640-token recompute (0.640 s) and the margin keeps the request there;
    with it, the 128 tokens it packs into the queued prefill's last step are charged too (0.856
    s), and it moves."""
    kept = _decide(packing=False)
    assert kept.worker_id == 1 and kept.reason == "ttft: within the margin"
    assert kept.scores == pytest.approx({0: 0.640, 1: 0.728})
    moved = _decide(packing=True)
    assert moved.worker_id == 0 and moved.reason == "ttft: lowest cost"
    assert moved.scores == pytest.approx({0: 0.640, 1: 0.856})
