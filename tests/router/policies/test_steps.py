"""Queued prefill priced by the engine steps it takes (``step_cost.queue_wait_seconds``): the
function on hand-computed cases, admission's wait by steps, ttft's
queue at one step's fixed cost, and the step budget a worker reports reaching the policy's
view."""

from __future__ import annotations

import pytest

from radixray.cache_index import ApproxIndex
from radixray.protocol import LoadReport, WorkerInfo
from radixray.router.admission import queue_wait_s
from radixray.router.policies import RoutingRequest, WorkerState, make_policy
from radixray.step_cost import queue_wait_seconds, step_fixed_s

P = 16


def test_a_step_costs_its_fixed_cost_once_the_larger_of_the_fit_and_a_decode_step():
    assert step_fixed_s(0.05, 0, 0.3) == 0.05  # nothing decodes: the fit's intercept
    assert step_fixed_s(0.05, 8, 0.3) == 0.3  # 8 decodes ride along: a decode step now
    assert step_fixed_s(0.05, 8, 0.01) == 0.05  # the intercept already holds them


def test_without_a_reported_budget_a_step_holds_whatever_is_queued():
    # no step runs before a new request's first: the queue's tokens at the rate
    assert queue_wait_seconds(3000, 3, 0, 0.02, 1000.0, 0.1) == pytest.approx(3.0)


def test_the_wait_counts_the_steps_before_a_requests_first_chunk():
    # 250 queued, 80 prefill tokens a step: 3 full steps run before it; its first chunk rides
    # in the fourth, on the 70 tokens the queue's last 10 leave
    assert queue_wait_seconds(250, 20, 100, 0.05, 1000.0, 0.1) == pytest.approx(3 * 0.1 + 0.25)
    assert queue_wait_seconds(70, 20, 100, 0.05, 1000.0, 0.1) == pytest.approx(0.07)
    assert queue_wait_seconds(0, 20, 100, 0.05, 1000.0, 0.1) == 0.0


def state(wid, queued=0, running=0, budget=0, rate=1000.0, overhead=0.02, decode=0.0, **kw):
    return WorkerState(
        wid,
        running=running,
        queued_prefill_tokens=queued,
        prefill_tokens_per_s=rate,
        prefill_overhead_s=overhead,
        decode_step_s=decode,
        max_batch_tokens=budget,
        **kw,
    )


def test_admission_waits_by_steps():
    # 3,000 queued on 64-token steps with 32 decodes: 93 full steps of a 0.4 s decode step
    # before a new request's first chunk, and the tokens at 1000/s
    slow = state("a", 3000, running=32, budget=64, decode=0.4)
    assert slow.queue_wait_s() == pytest.approx(93 * 0.4 + 3.0)
    # the same queue on a worker with a budget its decodes barely dent: 3000 // 992 = 3 steps
    fast = state("b", 3000, running=32, budget=1024, decode=0.4)
    assert fast.queue_wait_s() == pytest.approx(3 * 0.4 + 3.0)
    assert queue_wait_s([slow, fast]) == pytest.approx(3 * 0.4 + 3.0)
    # a worker that reports no budget: no step before its first, the queue at the fit
    assert state("c", 3000).queue_wait_s() == pytest.approx(3.0)


def test_ttft_prices_a_queue_at_one_steps_fixed_cost_whatever_the_budget():
    """Two workers with the same queued tokens and fit; one runs 28 decodes on a 32-token step
    budget (4 prefill tokens a step), the other 4 (28 a step). ttft prices the queue at the fit
    and one step's fixed cost, not by the steps it takes as admission does (benchmarks/README.md,
    "ttft's terms, measured": a burst across routers herded): wait 0.40 s and prefill 0.05 +
    0.064 + a decode step 0.05 s on both, a tie."""
    idx = ApproxIndex(P, 1 << 16)
    for w in (0, 1):
        idx.add_worker(w)
    common = {"queued": 400, "budget": 32, "rate": 1000.0, "overhead": 0.05, "decode": 0.05}
    room = {"free_pages": 100, "total_pages": 100}
    workers = [state(0, running=28, **common, **room), state(1, running=4, **common, **room)]
    request = RoutingRequest("r", 4 * P, list(range(100, 104)), None, 0.0)
    d = make_policy("ttft", seed=1).choose(request, workers, idx)
    assert d.scores[0] == d.scores[1] and d.decided_by == "tie"
    assert d.terms[0] == pytest.approx((0.4, 0.05 + 0.064 + 0.05, 0, 0, 0, 0), abs=1e-9)
    assert d.terms[1] == d.terms[0]


def test_a_worker_reports_its_step_budget_to_the_policy_view():
    from radixray.router.worker_pool import WorkerEntry, WorkerPool
    from radixray.sim import Workload, timing_preset
    from radixray.sim.sim_worker import SimWorker
    from radixray.worker import Engine, EngineConfig

    cfg = EngineConfig(model="tiny", page_size=4, device="cpu", seed=0, max_batch_tokens=48)
    with Engine(cfg) as e:
        load, _ = e.report()
    assert load.max_batch_tokens == 48
    pool = WorkerPool(ApproxIndex(4))
    info = WorkerInfo("w", "epoch", "tiny", 4, 4096, 320, "radix", 64, "cpu", "")
    pool.workers["w"] = WorkerEntry(None, "w", info, load)
    (seen,) = pool.states()
    assert seen.max_batch_tokens == 48
    assert LoadReport().max_batch_tokens == 0  # a worker that does not say: unknown
    timing = timing_preset("cpu", max_batch_tokens=96)
    sim = SimWorker(0, 64, P, timing, Workload("none", [], P))
    assert sim.state().max_batch_tokens == 96
