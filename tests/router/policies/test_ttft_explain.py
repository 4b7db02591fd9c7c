"""Every ttft decision explains itself: ``Decision.terms`` holds each candidate's cost split into
``TERMS`` (wait, prefill, load, recompute, evict, decode), summing to its score, and
``Decision.decided_by`` names the term that separated the winner from the runner-up ("margin",
"tie" or "alone" where no term did). ``TTFTConfig`` holds ttft's settings and checks them."""

from __future__ import annotations

import re

import pytest

from radixray.router.policies import RoutingRequest, WorkerState, make_policy
from radixray.router.policies.base import separating_term
from radixray.router.policies.ttft import TERMS
from radixray.router.policies.ttft_config import TTFTConfig

from .test_policies import P, index_with


def req(k: int = 0) -> RoutingRequest:
    return RoutingRequest(k, 8 * P, list(range(1000, 1008)), None)


def worker(wid, **kw) -> WorkerState:
    """100 prefill tokens/s (a token 0.01 s), 100 pages with room, 50-token answers at 1 ms a
    sequence a step; ``kw`` overrides."""
    base = {"prefill_tokens_per_s": 100.0, "total_pages": 100, "free_pages": 100,
            "decode_seq_s": 0.001, "answer_tokens": 50.0}  # fmt: skip
    return WorkerState(wid, **(base | kw))


def test_every_candidate_gets_each_term_by_hand():
    """A 128-token prompt, reuse weight L = 0.5, memory 2 (the reuse share h = 0.5 * 96 / 128 =
    0.375 after this arrival, the evicted rate h before any loss), 150 of the fleet's 400
    pages in use (stale = h * 0.375 = 0.140625), 50-token answers.

    - 0: holds 6 device pages (96 tokens), 1 running, 1 waiting, 200 tokens queued: wait 2.00,
      prefill 32 tokens 0.32, decode 50 * 0.001 * (1/2 + 1) = 0.075; 2.395 s.
    - 1: idle, 2 pages on its device and 2 on its host tier (64 tokens, 32 loaded back at
      1,000 tokens/s after 10 ms), no free page, 1 free host page of 10: prefill 64 tokens
      0.64, load 0.01 + 0.032 = 0.042, recompute (0.5 + 0.140625) * (96 - 64) * 0.01 = 0.205,
      evict: 96 tokens pushed out, 16 demoted to the host tier, 80 lost, 0.375 * 80 * 0.01 +
      0.375 * (0.01 + 0.016) = 0.30975; 1.19675 s.
    - 2: idle, holds nothing, but the 64 tokens two workers of four hold count as held there:
      prefill 0.64, recompute 0.205; 0.845 s.
    - 3: 2 running, holds nothing, 50 free pages: prefill 1.28, recompute 0.640625 * 96 * 0.01 =
      0.615, decode 50 * 0.001 * 1 = 0.05; 1.945 s.

    Worker 2 wins; against the runner-up, worker 1, the evict term differs most (0.30975 s)."""
    idx = index_with(w0=6, w1=2)
    idx.insert(1, list(range(1002, 1004)), tier="host")
    host = {"load_tokens_per_s": 1000.0, "load_overhead_s": 0.01, "host_free_pages": 1}
    fleet = [
        worker(0, running=1, waiting=1, queued_prefill_tokens=200),
        worker(1, free_pages=0, host_total_pages=10, **host),
        worker(2),
        worker(3, running=2, free_pages=50),
    ]
    d = make_policy("ttft", reuse_weight=0.5, memory=2).choose(req(), fleet, idx)
    assert d.term_names == TERMS == ("wait", "prefill", "load", "recompute", "evict", "decode")
    expected = {
        0: (2.0, 0.32, 0, 0, 0, 0.075),
        1: (0, 0.64, 0.042, 0.205, 0.30975, 0),
        2: (0, 0.64, 0, 0.205, 0, 0),
        3: (0, 1.28, 0, 0.615, 0, 0.05),
    }
    assert set(d.terms) == set(d.scores) == {0, 1, 2, 3}
    for w, terms in expected.items():
        assert d.terms[w] == pytest.approx(terms, abs=1e-9), w
        assert len(d.terms[w]) == len(TERMS)
        assert sum(d.terms[w]) == pytest.approx(d.scores[w], abs=1e-12)
    assert d.scores == pytest.approx({0: 2.395, 1: 1.19675, 2: 0.845, 3: 1.945}, abs=1e-9)
    assert d.worker_id == 2 and d.reason == "ttft: lowest cost"
    assert d.decided_by == "evict" and d.predicted_cached_tokens == 0


def test_decided_by_names_the_queue_a_held_prefix_loses_to_or_the_prefill_it_saves():
    """Worker 0 holds 6 of the 8 pages behind 300 queued tokens, worker 1 is idle; L = 0. The
    holder costs wait 3.00 + prefill 0.32 + decode 0.025 (its running request shares the
    answer's steps: 50 * 0.001 / 2), the idle worker prefill 1.28: it moves, and the wait
    separates them (3.00 s against the 0.96 s of prefill the prefix saves). Behind 50 tokens
    the holder costs 0.50 + 0.32 + 0.025 and keeps it: the prefill saved separates them."""
    idx = index_with(w0=6)
    for queued, winner, term in ((300, 1, "wait"), (50, 0, "prefill")):
        fleet = [worker(0, running=1, queued_prefill_tokens=queued), worker(1)]
        d = make_policy("ttft", reuse_weight=0.0).choose(req(), fleet, idx)
        assert d.worker_id == winner and d.decided_by == term
        assert d.terms[0] == pytest.approx((queued / 100, 0.32, 0, 0, 0, 0.025), abs=1e-9)
        assert d.terms[1] == pytest.approx((0, 1.28, 0, 0, 0, 0), abs=1e-12)


def test_decided_by_names_the_margin_a_tie_and_a_lone_worker():
    """Worker 0 holds the whole prompt (127 tokens, the last never counts) behind 140 queued
    tokens of 2 waiting requests: wait 1.40 + prefill 0.01 + decode 50 * 0.001 * 2 = 0.1, 1.51
    s; an idle worker costs 1.28 s, a saving of 15%, inside the 20% margin.
    With the prefix asked for by one arrival in a hundred the margin keeps the request on its
    holder ("margin"); with the margin off it moves, on the wait. Two idle workers: a tie; one
    worker: alone."""
    idx = index_with(w0=8)
    fleet = [worker(0, waiting=2, queued_prefill_tokens=140), worker(1)]
    kept = make_policy("ttft", reuse_weight=0.0)
    for k in range(99):
        kept.demand.observe(("other", k))
    d = kept.choose(req(), fleet, idx)
    assert d.worker_id == 0 and d.reason == "ttft: within the margin"
    assert d.decided_by == "margin"
    assert d.terms[0] == pytest.approx((1.40, 0.01, 0, 0, 0, 0.1), abs=1e-9)
    assert d.terms[1] == pytest.approx((0, 1.28, 0, 0, 0, 0), abs=1e-12)
    assert d.scores[1] > 0.8 * d.scores[0]
    moved = make_policy("ttft", reuse_weight=0.0, margin=0.0).choose(req(), fleet, idx)
    assert moved.worker_id == 1 and moved.decided_by == "wait"
    assert moved.scores == d.scores
    tie = make_policy("ttft").choose(req(), [worker(0), worker(1)], index_with())
    assert tie.decided_by == "tie" and tie.scores[0] == tie.scores[1]
    alone = make_policy("ttft").choose(req(), [worker(3, running=4)], index_with(w3=8))
    assert alone.worker_id == 3 and alone.decided_by == "alone"
    assert alone.terms == {3: pytest.approx((0, 0.01, 0, 0, 0, 0.1), abs=1e-12)}


@pytest.mark.parametrize(
    "settings, field",
    [
        ({"margin": 1.0}, "margin"),
        ({"margin": -0.1}, "margin"),
        ({"memory": 1}, "memory"),
        ({"shared_share": 0}, "shared_share"),
        ({"shared_share": 1.0}, "shared_share"),
        ({"min_match": 1.0}, "min_match"),
        ({"reuse_weight": -1.0}, "reuse_weight"),
    ],
)
def test_ttft_config_rejects_a_setting_out_of_range_by_name(settings, field):
    with pytest.raises(ValueError, match=f"^{field} must be"):
        TTFTConfig(**settings)
    with pytest.raises(ValueError, match=f"^{field} must be"):
        make_policy("ttft", **settings)


def test_ttft_config_spec_and_the_parameters_a_spec_takes():
    assert TTFTConfig().spec() == "ttft"
    assert TTFTConfig(margin=0.1).spec() == "ttft:margin=0.1"
    assert TTFTConfig(memory=8, tiers=False).spec() == "ttft:memory=8:tiers=False"
    policy = make_policy("ttft:margin=0.1")
    assert policy.config == TTFTConfig(margin=0.1) and policy.name == "ttft:margin=0.1"
    assert make_policy("ttft", margin=0.1).config == TTFTConfig(margin=0.1)
    assert make_policy("ttft", config=TTFTConfig(memory=8)).config.memory == 8
    assert make_policy("ttft:memory=8").capacity.memory == 8
    valid = "reuse_weight, memory, min_match, margin, shared_share, tiers, seed, config"
    for removed in ("ewma_requests", "stale", "lpm", "tail"):
        message = f"policy 'ttft' has no parameter '{removed}'; its parameters: {valid}"
        with pytest.raises(ValueError, match=re.escape(message)):
            make_policy(f"ttft:{removed}=4")


def test_separating_term_names_the_widest_gap_to_the_first_runner_up():
    names = ("a", "b", "c")
    terms = {"w": (1.0, 0.0, 0.0), "x": (1.0, 2.0, 2.0), "y": (1.0, 0.0, 4.0)}
    scores = {k: sum(v) for k, v in terms.items()}
    # runner-up of w: x and y both 5.0, x first (y would say c); gaps b and c both 2.0: b first
    assert separating_term("w", scores, terms, names) == "b"
    assert separating_term("w", {"w": 1.0, "x": 1.0}, terms, names) == "tie"
    assert separating_term("w", {"w": 1.0}, terms, names) == "alone"
