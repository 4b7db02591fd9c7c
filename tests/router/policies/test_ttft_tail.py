"""ttft's tail weight and margin (docs/ttft_policy.md, "The tail guard"): a request's predicted
seconds past the TTFT tail its workload sets by itself count once more; a move off a holder must
save more than the margin."""

from __future__ import annotations

import random

import pytest

from radixray.router.policies import RoutingRequest, WorkerState, make_policy
from radixray.router.policies.tail import IdealTail

from .test_policies import P, index_with


def test_the_tail_is_the_windows_exact_quantile():
    rng = random.Random(7)
    tail = IdealTail(quantile=0.9, window=50, min_samples=10)
    seen = []
    for _ in range(400):
        x = rng.expovariate(1.0)
        tail.observe(x)
        seen.append(x)
        recent = sorted(seen[-50:])
        if len(recent) < 10:
            assert tail.value is None
        else:
            assert tail.value == recent[min(len(recent) - 1, int(0.9 * len(recent)))]
    assert len(tail) == 50


def test_old_samples_leave_the_window():
    tail = IdealTail(quantile=0.5, window=4, min_samples=1)
    for x in (9.0, 9.0, 9.0, 9.0):
        tail.observe(x)
    for x in (1.0, 2.0, 3.0, 4.0):
        tail.observe(x)
    assert tail.value == 3.0  # the 9s are gone


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"quantile": 1.0}, "quantile"),
        ({"window": 1}, "window"),
        ({"min_samples": 0}, "min_samples"),
    ],
)
def test_bad_settings_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        IdealTail(**kwargs)


def _fleet(holder_queue: int) -> list[WorkerState]:
    """Worker 1 holds the prompt's prefix behind ``holder_queue`` queued tokens; 0, 2, 3 idle.
    100 prefill tokens/s everywhere."""

    def w(wid, queued=0, waiting=0):
        return WorkerState(
            wid,
            waiting=waiting,
            queued_prefill_tokens=queued,
            free_pages=1000,
            total_pages=1000,
            prefill_tokens_per_s=100.0,
        )

    return [w(0), w(1, queued=holder_queue, waiting=2), w(2), w(3)]


def _choose(policy, holder_queue: int):
    request = RoutingRequest(0, 8 * P, list(range(1000, 1008)), None)
    return policy.choose(request, _fleet(holder_queue), index_with(w1=8))


def _with_tail(tail_s: float | None, **kwargs):
    p = make_policy("ttft", seed=0, **({"tail": 1.0, "reuse_weight": 1.0} | kwargs))
    if tail_s is not None:
        for _ in range(300):
            p.ideal.observe(tail_s)
    return p


def test_seconds_past_the_tail_count_once_more():
    """The holder's queue is 2.40 s (2.41 with the prompt's last token); recomputing the
    128-token prompt on an idle worker takes 1.28 s, twice that with a reuse weight of 1: 2.56,
    so the cost model keeps it on the holder. With a tail of 1.5 s (the workload's ideal TTFTs)
    the holder's 0.91 s past it count once more (3.32) and it goes to an idle worker, which
    stays under; with a tail of 3 s, the weight off, or before the tail is known, it stays."""
    d = _choose(_with_tail(1.5), holder_queue=240)
    assert d.worker_id in (0, 2, 3)
    assert d.scores[1] == pytest.approx(2.41 + 1.0 * (2.41 - 1.5))
    assert _choose(_with_tail(3.0), holder_queue=240).worker_id == 1
    assert _choose(_with_tail(None, tail=0.0), holder_queue=240).worker_id == 1
    assert _choose(_with_tail(None), holder_queue=240).worker_id == 1  # no tail yet
    assert make_policy("ttft").ideal is None  # measured, not adopted: off by default


def test_the_tail_is_weighed_against_the_reuse_weight():
    """With a reuse weight of 10 the recompute costs 14.08 s: 0.91 s past the tail, even counted
    three times more, does not pay for it."""
    assert _choose(_with_tail(1.5, tail=3.0, reuse_weight=10.0), holder_queue=240).worker_id == 1


def test_each_routed_request_feeds_its_ideal_ttft():
    """The ideal is the prompt less the longest held prefix, on the fastest idle worker: 1 token
    here (the last is always computed) at 100 tokens/s."""
    p = make_policy("ttft", seed=0, tail=1.0)
    _choose(p, holder_queue=0)
    assert len(p.ideal) == 1 and p.ideal._sorted == [pytest.approx(0.01)]
    with pytest.raises(ValueError, match="tail"):
        make_policy("ttft", tail=-1.0)


def test_a_move_off_the_holder_must_save_more_than_the_margin():
    """Myopic costs (reuse weight 0): the holder's is its queue and one token, an idle worker's
    the 128-token recompute, 1.28 s. Behind 1.40 s of queue the move saves 9% of the holder's
    cost: taken with no margin, not with a 20% one; behind 3 s it saves 57%: taken with both.
    (The plain margin: test_ttft_demand has the one that knows a copy's return.)"""

    def pick(margin: float, holder_queue: int) -> int:
        p = make_policy("ttft", seed=0, reuse_weight=0.0, margin=margin, demand=False)
        return _choose(p, holder_queue).worker_id

    assert pick(0.0, 140) != 1
    assert pick(0.2, 140) == 1
    assert pick(0.0, 300) != 1
    assert pick(0.2, 300) != 1
    with pytest.raises(ValueError, match="margin"):
        make_policy("ttft", margin=1.0)
