"""Closed-loop turns and literal tokens in the simulator: a request with ``after`` arrives when
its previous turn finishes (as a chat client that waits for the answer), and literal segments
replay exact token ids (a live run's), so a next turn hits the answer the worker cached."""

from __future__ import annotations

import pytest

from radixray.sim import SimConfig, simulate
from radixray.sim.workload import SimRequest, Workload

P = 4
P1 = tuple(range(100, 130))  # turn 1's prompt: 30 tokens
A1 = tuple(range(200, 211))  # its answer: 11 tokens
P2 = P1 + A1 + tuple(range(300, 310))  # turn 2 repeats both, then asks again


def two_turns(think_floor: float = 0.0) -> Workload:
    return Workload(
        "two_turns",
        [
            SimRequest(0, 0.0, ((1, len(P1)),), len(A1), "c0", output_seg=2),
            SimRequest(1, think_floor, ((3, len(P2)),), 3, "c0", after=0),
            SimRequest(2, 0.0, ((9, 8),), 2, "c1"),  # made-up tokens beside the literal ones
        ],
        0,
        literal={1: P1, 2: A1, 3: P2},
    )


def test_a_turn_arrives_when_its_previous_turn_finishes_and_hits_its_answer():
    wl = two_turns()
    res = simulate(wl, "round_robin", SimConfig(num_workers=1, num_pages=64, page_size=P))
    first, second = (next(r for r in res.records if r.rid == k) for k in (0, 1))
    assert second.arrival == first.finish
    assert second.first_token > first.finish
    # Turn 1 leaves prompt + answer but its last token cached (that token was never computed),
    # in full pages; turn 2 reuses all of it.
    assert first.cached == 0
    assert second.cached == (len(P1) + len(A1) - 1) // P * P == 40


def test_an_arrival_later_than_the_previous_finish_is_kept():
    wl = two_turns(think_floor=1e6)
    res = simulate(wl, "round_robin", SimConfig(num_workers=1, num_pages=64, page_size=P))
    second = next(r for r in res.records if r.rid == 1)
    assert second.arrival == 1e6


def test_made_up_tokens_start_above_every_literal_id():
    wl = two_turns()
    made_up = wl.tokens(next(r for r in wl.requests if r.rid == 2))
    assert len(made_up) == 8 and min(made_up) > max(P2)
    assert wl.tokens(next(r for r in wl.requests if r.rid == 1)) == list(P2)
    assert wl.output_tokens(next(r for r in wl.requests if r.rid == 0)) == list(A1)


def test_bad_after_and_short_literal_are_named():
    with pytest.raises(ValueError, match="after=5 must name a request earlier"):
        Workload("x", [SimRequest(0, 0.0, ((1, 2),), 1, after=5)], 0, literal={1: (1, 2)})
    with pytest.raises(ValueError, match="segment 1 is used with 3 tokens but has 2"):
        Workload("x", [SimRequest(0, 0.0, ((1, 3),), 1)], 0, literal={1: (1, 2)})
