"""ttft's margin knows a copy's return (docs/ttft_policy.md, "The
margin"): a move off a prefix's holders must save more than the margin only while the prefix is
asked for no more often than its holders serve (``PrefixDemand``)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from radixray.router.policies import RoutingRequest, WorkerState, make_policy
from radixray.router.policies.demand import PrefixDemand

from .test_policies import P, index_with

KEY = 1007  # the deepest held block of the scripted prompt (blocks 1000..1007)


def test_the_share_is_the_windows_exact_count():
    rng = random.Random(3)
    demand = PrefixDemand(window=40)
    seen = []
    for _ in range(300):
        key = rng.choice(["a", "b", "c", None])
        demand.observe(key)
        seen.append(key)
        recent = Counter(seen[-40:])
        for k in ("a", "b", "c"):
            assert demand.share(k) == recent[k] / len(seen[-40:])
    assert len(demand) == 40
    assert demand.share(None) == 0.0  # arrivals no worker holds count under no prefix
    assert PrefixDemand().share("a") == 0.0  # an empty window


def test_old_arrivals_leave_the_window():
    demand = PrefixDemand(window=4)
    for key in ("a", "a", "a", "a", "b", "b", None):
        demand.observe(key)
    assert demand.share("a") == 0.25 and demand.share("b") == 0.5
    for key in ("c", "c", "c", "c"):
        demand.observe(key)
    assert demand.share("a") == demand.share("b") == 0.0 and demand.share("c") == 1.0
    assert "a" not in demand._counts  # no key outlives its arrivals
    with pytest.raises(ValueError, match="window"):
        PrefixDemand(window=0)


def test_under_replicated_is_share_of_arrivals_over_share_of_workers():
    demand = PrefixDemand(window=8)
    for key in ("hot",) * 4 + ("own",) + (None,) * 3:
        demand.observe(key)
    # "hot": half the arrivals; 8 workers serve it if at least 4 hold it
    assert demand.under_replicated("hot", holders=3, workers=8)
    assert not demand.under_replicated("hot", holders=4, workers=8)
    # "own": one arrival in 8, one holder of 8 workers: served
    assert not demand.under_replicated("own", holders=1, workers=8)


def _fleet(holders: set[int], queued: int) -> list[WorkerState]:
    """Four workers at 100 prefill tokens/s; the ``holders`` hold the prompt's prefix behind
    ``queued`` tokens each, the rest are idle."""

    def w(wid):
        busy = wid in holders
        return WorkerState(
            wid,
            waiting=2 if busy else 0,
            queued_prefill_tokens=queued if busy else 0,
            free_pages=1000,
            total_pages=1000,
            prefill_tokens_per_s=100.0,
        )

    return [w(i) for i in range(4)]


def _decide(holders: set[int], history: list, **kwargs):
    """Myopic costs (reuse weight 0) and a 20% margin: behind 1.40 s of queue a move to an idle
    worker (the 128-token recompute, 1.28 s) saves 9% of a holder's cost (1.41 s). ``history``:
    the keys of the arrivals the router saw before this one."""
    p = make_policy("ttft", seed=0, reuse_weight=0.0, margin=0.2, **kwargs)
    for key in history:
        p.demand.observe(key)
    request = RoutingRequest(0, 8 * P, list(range(1000, 1008)), None)
    index = index_with(**{f"w{h}": 8 for h in holders})
    return p.choose(request, _fleet(holders, 140), index)


def _pick(holders: set[int], history: list, **kwargs) -> int:
    return _decide(holders, history, **kwargs).worker_id


def test_a_conversations_own_history_stays_on_its_holder():
    """One arrival in a hundred asks for this prefix, held by one of four workers: a copy serves
    no one else, so the margin holds and the request stays on its holder, though an idle worker
    costs less (1.28 s against 1.40 s of wait and 0.01 s of prefill)."""
    d = _decide({1}, [f"other{i}" for i in range(99)])
    assert d.worker_id == 1 and d.reason == "ttft: within the margin"  # the record says why
    assert d.decided_by == "margin"
    assert d.terms[1] == pytest.approx((1.40, 0.01, 0, 0, 0, 0), abs=1e-9)
    assert d.terms[0] == pytest.approx((0, 1.28, 0, 0, 0, 0), abs=1e-12)
    assert d.scores[0] < d.scores[1]


def test_a_prefix_asked_for_more_than_its_holders_serve_gets_a_copy():
    """Half the arrivals ask for this prefix and one worker of four holds it: under-replicated,
    the margin does not hold and the cost model's move to an idle worker stands, though it saves
    only 9% of the holder's cost (1.28 s against 1.41 s: within the margin, the demand check is
    what lets it move; it and the other idle workers cost the same, a tie). With two holders of
    four the same demand is served, and the margin keeps the request on a holder
    (``shared_share=0.5``: by default an idle worker counts a prefix two workers of four hold as
    its own, and the move is no recompute)."""
    history = [KEY if i % 2 else f"other{i}" for i in range(99)]
    d = _decide({1}, history)
    assert d.worker_id in (0, 2, 3) and d.reason == "ttft: lowest cost"
    assert d.scores[d.worker_id] == pytest.approx(1.28, abs=1e-12)
    assert d.scores[1] == pytest.approx(1.41, abs=1e-9)
    assert d.scores[d.worker_id] > (1 - 0.2) * d.scores[1]  # within the margin all the same
    assert d.decided_by == "tie"
    kept = _decide({1, 2}, history, shared_share=0.5)
    assert kept.worker_id in (1, 2) and kept.decided_by == "margin"
    assert _pick({1, 2}, history[1::2] * 2, shared_share=0.5) in (0, 3)  # all of them: 4 > 2
    # by default the idle workers count the two holders' prefix as held: 1 token to compute
    d = _decide({1, 2}, history)
    assert d.worker_id in (0, 3) and d.terms[0] == pytest.approx((0, 0.01, 0, 0, 0, 0), abs=1e-12)


def test_demand_is_counted_with_a_margin_only():
    assert make_policy("ttft", margin=0.0).demand is None
    p = make_policy("ttft", seed=0)  # the default: a 20% margin that counts demand
    assert p.config.margin == 0.2
    request = RoutingRequest(0, 8 * P, list(range(1000, 1008)), None)
    p.choose(request, _fleet({1}, 0), index_with(w1=8))
    p.choose(RoutingRequest(1, 8 * P, list(range(2000, 2008)), None), _fleet({1}, 0), index_with())
    assert len(p.demand) == 2 and p.demand.share(KEY) == 0.5  # the cold one counts under None
    assert make_policy("ttft:margin=0.1").demand is not None


@pytest.mark.parametrize("spec", ["ttft", "ttft:margin=0.5", "ttft:margin=0"])
def test_a_prefix_only_an_unhealthy_worker_holds_is_no_ones(spec):
    """The index still lists the prompt on worker 1, which is unhealthy: no live worker holds
    it, so nothing is reused, the margin has no holder to keep the request on, and the decision
    is the idle fleet's."""
    fleet = _fleet(set(), 0)
    fleet[1] = WorkerState(1, free_pages=1000, total_pages=1000, healthy=False)
    request = RoutingRequest(0, 8 * P, list(range(1000, 1008)), None)
    d = make_policy(spec, seed=0).choose(request, fleet, index_with(w1=8))
    assert d.worker_id in (0, 2, 3) and d.predicted_cached_tokens == 0
    assert d.reason == "ttft: lowest cost" and set(d.scores) == {0, 2, 3}
    assert len(set(d.scores.values())) == 1  # all idle, nothing held: one cost
