"""ttft prices the steps a placement's answer adds for the requests already on a worker
(docs/ttft_policy.md, "Decode cost"): each decode step of the answer is ``decode_seq_s`` longer
for every request sharing it, waiting ones for all of it, running ones for about half."""

from __future__ import annotations

from radixray.router.policies import RoutingRequest, WorkerState, make_policy
from radixray.router.policies.ttft import decode_cost

from .test_policies import P, index_with


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


def test_decode_cost_counts_who_shares_the_answers_steps():
    w = worker(0, running=6, waiting=2)
    assert abs(decode_cost(w, 100.0) - 0.01 * 100 * (3 + 2)) < 1e-12
    assert decode_cost(worker(1, seq_s=0.0, running=6), 100.0) == 0.0  # not measured
    assert decode_cost(w, 0.0) == 0.0  # no answer length known yet
    assert decode_cost(worker(2), 100.0) == 0.0  # nobody there to slow down


def test_an_answer_on_full_steps_takes_budget_from_the_prefill_waiting_there():
    """8-token steps, 2 decoding, 20 ms a step's fixed cost, 100 prefill tokens/s: a prefill token
    costs 10 ms + 20 ms / 6 on full steps (10 ms at the fit's rate alone, as ttft prices a
    recompute unless ``steps``). With 40 tokens queued (the steps are full) each of the 3 waiting
    requests waits that long for every answer token; with 5 queued (steps not full) the answer
    costs its decode time only."""

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
        )

    decode_only = 10 * 0.001 * (1 + 3)
    assert abs(decode_cost(w(5), 10.0) - decode_only) < 1e-12
    assert abs(decode_cost(w(40), 10.0) - (decode_only + 10 * 3 * (0.01 + 0.02 / 6))) < 1e-12
    # priced as ttft prices recomputes by default, at the fit's rate alone
    assert abs(decode_cost(w(40), 10.0, steps=False) - (decode_only + 10 * 3 * 0.01)) < 1e-12


def test_ttft_moves_off_a_crowded_holder_when_its_answer_slows_everyone_there():
    """Worker 1 holds 6 of the 8 pages and runs 8 decoding requests; worker 0 is idle; caches
    have room (no stale charge) and L = 0. Staying costs 32 tokens (0.32 s), moving 128 (1.28 s):
    it stays while decodes are cheap here (0.5 ms a sequence a step over 40-token answers: 0.02 s
    for each of 4 running-equivalents, 0.08 s). At 10 ms over 100-token answers its answer adds
    1 s for each (4 s): recomputing the prefix on the idle worker is cheaper, and
    ``decode=false`` keeps it where it was."""
    idx = index_with(w1=6)
    cheap = [worker(0, seq_s=0.0005, answer=40), worker(1, running=8, seq_s=0.0005, answer=40)]
    dear = [worker(0), worker(1, running=8)]
    for name, fleet, expected in (("cheap", cheap, 1), ("dear", dear, 0)):
        policy = make_policy("ttft", reuse_weight=0.0)
        d = policy.choose(req(), fleet, idx)
        assert d.worker_id == expected, name
    blind = make_policy("ttft", reuse_weight=0.0, decode=False)
    d = blind.choose(req(), dear, idx)
    assert d.worker_id == 1
    with_decode = make_policy("ttft", reuse_weight=0.0).choose(req(), dear, idx)
    assert abs(with_decode.scores[1] - (blind.choose(req(), dear, idx).scores[1] + 4.0)) < 1e-9
