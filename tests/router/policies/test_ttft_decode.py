"""ttft prices the steps a placement's answer adds for the requests already on a worker (the
``decode`` term, docs/ttft_policy.md): each decode step of the answer is ``decode_seq_s`` longer
for every request sharing it, waiting ones for all of it, running ones for about half."""

from __future__ import annotations

import pytest

from radixray.router.policies import RoutingRequest, WorkerState, make_policy
from radixray.router.policies.ttft import TERMS

from .test_policies import P, index_with

DECODE = TERMS.index("decode")


def req(k: int = 0) -> RoutingRequest:
    return RoutingRequest(k, 8 * P, list(range(1000, 1008)), None)


def worker(wid, queued=0, running=0, waiting=0, seq_s=0.01, answer=100.0):
    return WorkerState(
        wid,
        running=running,
        waiting=waiting,
        queued_prefill_tokens=queued,
        free_pages=100,
        total_pages=100,
        prefill_tokens_per_s=100.0,
        decode_seq_s=seq_s,
        answer_tokens=answer,
    )


def decode_term(w: WorkerState) -> float:
    """The decode term of placing ``req()`` on ``w`` alone (the answer's length: its own
    report)."""
    d = make_policy("ttft").choose(req(), [w], index_with())
    assert d.decided_by == "alone"
    return d.terms[w.worker_id][DECODE]


def test_decode_cost_counts_who_shares_the_answers_steps():
    """100-token answers at 10 ms a sequence a step: 6 running (half each) and 2 waiting share
    them, 0.01 * 100 * (3 + 2) = 5 s."""
    assert abs(decode_term(worker(0, running=6, waiting=2)) - 0.01 * 100 * (3 + 2)) < 1e-12
    assert decode_term(worker(1, seq_s=0.0, running=6)) == 0.0  # not measured
    assert decode_term(worker(0, running=6, waiting=2, answer=0.0)) == 0.0  # no answer known
    assert decode_term(worker(2)) == 0.0  # nobody there to slow down


def test_an_answer_on_full_steps_takes_budget_from_the_prefill_waiting_there():
    """8-token steps, 2 decoding, 20 ms a step's fixed cost, 100 prefill tokens/s, 10-token
    answers at 1 ms a sequence a step: 10 * 0.001 * (1 + 3) = 0.04 s of decode steps. With 40
    tokens queued (the steps are full) each of the 3 waiting requests also waits a prefill
    token's time for every answer token, priced at the fit's rate alone as ttft prices a
    recompute: 10 * 3 * 0.01 = 0.30 s more; with 5 queued (steps not full) the answer costs its
    decode time only."""

    def w(queued):
        return WorkerState(
            0,
            running=2,
            waiting=3,
            queued_prefill_tokens=queued,
            prefill_tokens_per_s=100.0,
            prefill_overhead_s=0.02,
            max_batch_tokens=8,
            decode_seq_s=0.001,
            answer_tokens=10.0,
        )

    decode_only = 10 * 0.001 * (1 + 3)
    assert abs(decode_term(w(5)) - decode_only) < 1e-12
    assert abs(decode_term(w(40)) - (decode_only + 10 * 3 * 0.01)) < 1e-12


def test_ttft_moves_off_a_crowded_holder_when_its_answer_slows_everyone_there():
    """Worker 1 holds 6 of the 8 pages and runs 8 decoding requests; worker 0 is idle; caches
    have room (no stale charge) and L = 0. Staying costs 32 tokens (0.32 s), moving 128 (1.28 s):
    it stays while decodes are cheap here (0.5 ms a sequence a step over 40-token answers: 0.02 s
    for each of 4 running-equivalents, decode 0.08 s). At 10 ms over 100-token answers its
    answer adds 1 s for each (decode 4 s): recomputing the prefix on the idle worker is cheaper,
    and the decode term is what separates them (without it, 0.32 s would stay)."""
    idx = index_with(w1=6)
    cheap = [worker(0, seq_s=0.0005, answer=40), worker(1, running=8, seq_s=0.0005, answer=40)]
    dear = [worker(0), worker(1, running=8)]
    policy = make_policy("ttft", reuse_weight=0.0)
    d = policy.choose(req(), cheap, idx)
    assert d.worker_id == 1 and d.decided_by == "prefill"
    assert d.terms[1] == pytest.approx((0, 0.32, 0, 0, 0, 0.08), abs=1e-12)
    assert d.terms[0] == pytest.approx((0, 1.28, 0, 0, 0, 0), abs=1e-12)
    d = policy.choose(req(), dear, idx)
    assert d.worker_id == 0 and d.decided_by == "decode"
    assert d.terms[1] == pytest.approx((0, 0.32, 0, 0, 0, 4.0), abs=1e-12)
    assert d.terms[0] == pytest.approx((0, 1.28, 0, 0, 0, 0), abs=1e-12)
    assert abs(d.scores[1] - 4.32) < 1e-9
    assert d.scores[1] - d.terms[1][DECODE] < d.scores[0]  # the decode term moves it
