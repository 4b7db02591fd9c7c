"""ttft's tail guard (docs/ttft_policy.md, "The tail guard"): a request is not left waiting on a
holder past the TTFT tail its workload sets by itself where another worker keeps it under."""

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


def test_a_request_past_the_tail_on_its_holder_goes_where_it_stays_under():
    """The holder's queue is 3 s; recomputing the 128-token prompt on an idle worker takes 1.28
    s, priced at 11x with a reuse weight of 10, so the cost model keeps it on the holder. With a
    tail of 2 s (the workload's ideal TTFTs) the guard sends it to an idle worker; with a tail
    of 5 s, or the guard off, or before the tail is known, it stays."""

    def policy(tail_s: float | None, **kwargs):
        p = make_policy("ttft", seed=0, reuse_weight=10.0, **({"tail": True} | kwargs))
        if tail_s is not None:
            for _ in range(300):
                p.tail.observe(tail_s)
        return p

    d = _choose(policy(2.0), holder_queue=300)
    assert d.worker_id in (0, 2, 3)
    assert d.reason == "ttft: tail guard"
    assert d.predicted_cached_tokens == 0
    assert _choose(policy(5.0), holder_queue=300).worker_id == 1
    assert _choose(policy(None, tail=False), holder_queue=300).worker_id == 1
    assert make_policy("ttft").tail is None  # measured, not adopted: off by default
    assert _choose(policy(None), holder_queue=300).worker_id == 1  # no tail yet: no guard
    # a short queue keeps it under the tail on its holder: no guard
    d = _choose(policy(2.0), holder_queue=50)
    assert (d.worker_id, d.reason) == (1, "ttft: best match")


def test_no_worker_under_the_tail_leaves_the_cost_models_choice():
    """Every worker's predicted TTFT is over a 0.5 s tail (the idle ones recompute 1.28 s): the
    guard has nowhere better to send it."""
    p = make_policy("ttft", seed=0, reuse_weight=10.0, tail=True)
    for _ in range(300):
        p.tail.observe(0.5)
    assert _choose(p, holder_queue=300).worker_id == 1


def test_each_routed_request_feeds_its_ideal_ttft():
    """The ideal is the prompt less the longest held prefix, on the fastest idle worker: 1 token
    here (the last is always computed) at 100 tokens/s."""
    p = make_policy("ttft", seed=0, tail=True)
    _choose(p, holder_queue=0)
    assert len(p.tail) == 1 and p.tail._sorted == [pytest.approx(0.01)]


def test_a_move_off_the_holder_must_save_more_than_the_margin():
    """Myopic costs (reuse weight 0): the holder's is its queue and one token, an idle worker's
    the 128-token recompute, 1.28 s. Behind 1.40 s of queue the move saves 9% of the holder's
    cost: taken with no margin, not with a 20% one; behind 3 s it saves 57%: taken with both."""

    def pick(margin: float, holder_queue: int) -> int:
        p = make_policy("ttft", seed=0, reuse_weight=0.0, margin=margin)
        return _choose(p, holder_queue).worker_id

    assert pick(0.0, 140) != 1
    assert pick(0.2, 140) == 1
    assert pick(0.0, 300) != 1
    assert pick(0.2, 300) != 1
    with pytest.raises(ValueError, match="margin"):
        make_policy("ttft", margin=1.0)
