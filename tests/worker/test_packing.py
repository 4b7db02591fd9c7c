"""Priced packing (worker/packing.py): how much more prefill a step takes once it finishes a
prompt. The arithmetic, the scheduler's exact chunks with it and without, and that no schedule it
makes changes a token or loses a page."""

from __future__ import annotations

import random

import pytest

from radixray.step_cost import StepCostModel
from radixray.worker.packing import StepPacking, fitted_step_costs
from radixray.worker.scheduler import SchedulerConfig

from .test_scheduler import expected_output, make_req, make_sched, run

CPU = (0.0301, 0.001855)  # the cpu preset's step overhead and seconds per prefill token


def costs(fixed_s=CPU[0], token_s=CPU[1]):
    return lambda decodes: (fixed_s, token_s)


def priced(costs_fn=None, num_pages=1024, **cfg):
    """A scheduler given step costs as the engine gives it its fits (P = 4); fcfs unless told,
    where each case's schedule reads plainest (running prefills first, then admissions)."""
    cfg.setdefault("prefill_order", "fcfs")
    return make_sched(num_pages, step_costs=costs_fn or costs(), **cfg)


def fitted(points):
    m = StepCostModel(decay=1.0)
    for x, y in points:
        m.update(x, y)
    return m


def items(batch):
    return [(it.req.request_id, it.start, it.num_tokens, it.sample) for it in batch.items]


def step(s):
    b = s.schedule()
    s.postprocess(b)
    for it in b.items:
        if it.sample:
            it.req.output_ids.append(7)
    return b


# ---------------------------------------------------------------- the arithmetic


def test_fitted_costs_need_a_fit_that_separates_the_fixed_cost():
    one_size = fitted([(512, 0.98), (512, 0.97)])
    assert fitted_step_costs(one_size, StepCostModel(), 0) is None  # a ratio has no fixed cost
    line = fitted([(64, 0.03 + 64 * 0.002), (512, 0.03 + 512 * 0.002)])
    fixed, token = fitted_step_costs(line, StepCostModel(), 0)
    assert fixed == pytest.approx(0.03) and token == pytest.approx(0.002)
    # decoding: a decode step of this batch when it costs more than the prefill fit's overhead
    decode = fitted([(1, 0.04 + 0.01), (8, 0.04 + 0.08)])
    assert fitted_step_costs(line, decode, 4)[0] == pytest.approx(0.08)
    assert fitted_step_costs(line, decode, 0)[0] == pytest.approx(0.03)
    assert fitted_step_costs(line, StepCostModel(), 4)[0] == pytest.approx(0.03)  # no decode fit


def test_the_limit_weighs_the_waiting_against_the_finishing():
    p = StepPacking(costs(0.03, 0.002), step_tokens=512)
    assert p.limit(500, 40, 1, 0) == 500  # nothing finishes yet: a full step
    p.note(decode=True, finishes=True)  # a decode never counts as a prompt finishing
    p.note(decode=False, finishes=False)  # a chunk that does not finish its prompt
    assert p.limit(500, 40, 1, 0) == 500
    p.note(decode=False, finishes=True)  # one prompt finishes; 511 prefill tokens a step
    # a candidate that would finish: its 40 tokens cost the finishing one 80 ms; left out, it
    # waits a step of 30 ms fixed and whatever is queued behind it shares that step
    assert p.limit(500, 40, 1, 0) == 0
    assert p.limit(500, 40, 2, 24) == 0  # 30 + 24 x 2 = 78 ms: still out
    assert p.limit(500, 40, 2, 25) == 500  # 80 ms: in
    assert p.limit(500, 15, 1, 0) == 500  # 30 ms for 15 tokens: in
    # a chunk that does not finish (600 > 500): a step of 511 tokens costs 1.022 s, worth it
    # for 35 prompts waiting a 30 ms step each, not for 34
    assert p.limit(500, 600, 34, 10_000) == 0
    assert p.limit(500, 600, 35, 10_000) == 500
    p.note(decode=False, finishes=True)  # two finishing: each packed token delays both
    assert p.limit(500, 15, 1, 0) == 0
    assert p.limit(500, 600, 69, 10_000) == 500 and p.limit(500, 600, 68, 10_000) == 0
    assert StepPacking(None, 512).limit(500, 40, 1, 0) == 500  # full packing, or no fit yet


# ---------------------------------------------------------------- the scheduler


def test_a_lone_prompt_behind_a_finishing_one_waits_a_short_step():
    """A's last 88 tokens finish in step 2; B arrived during step 1. Full packing fills the step
    with 424 of B's 700 tokens (A's first token waits ~0.8 s more on the cpu preset); priced
    packing leaves B to the next step, which costs B one step's fixed cost (30 ms)."""
    by_rule = {}
    for packing in ("full", "priced"):
        s = priced(num_pages=1024, max_batch_tokens=512, packing=packing)
        a, b = make_req("a", list(range(600))), make_req("b", list(range(1000, 1700)))
        s.add(a)
        assert items(step(s)) == [("a", 0, 512, False)]
        s.add(b)
        by_rule[packing] = items(step(s))
        assert items(step(s))[-1][0] == "b"  # B goes on in the next step either way
    assert by_rule["full"] == [("a", 512, 88, True), ("b", 0, 424, False)]
    assert by_rule["priced"] == [("a", 512, 88, True)]


def test_a_prompt_that_would_finish_too_waits_unless_its_next_step_is_long():
    """B's 100 tokens fit in the room A's last chunk leaves. Packed, they delay A's first token
    by 0.19 s to save B one 30 ms step: B waits. With 1,000 tokens of C queued behind B, B's
    next step would also compute 412 of C's (0.8 s): B rides along; C, which would not finish,
    does not."""
    for queued, want in ((False, [("a", 512, 88, True)]),
                         (True, [("a", 512, 88, True), ("b", 0, 100, True)])):  # fmt: skip
        s = priced(num_pages=1024, max_batch_tokens=512)
        s.add(make_req("a", list(range(600))))
        step(s)
        s.add(make_req("b", list(range(1000, 1100))))
        if queued:
            s.add(make_req("c", list(range(5000, 6000))))
        assert items(step(s)) == want


def test_a_queue_behind_still_fills_the_step():
    """40 long prompts waiting: leaving the room empty would cost each of them a step's overhead,
    more than the 424 tokens cost the prompt that finishes; the step is packed as full packing
    packs it."""
    s = priced(num_pages=2048, max_batch_tokens=512, max_running=64)
    s.add(make_req("a", list(range(600))))
    step(s)
    for i in range(40):
        s.add(make_req(f"q{i}", [5000 + 1000 * i + j for j in range(600)]))
    assert items(step(s)) == [("a", 512, 88, True), ("q0", 0, 424, False)]


def test_a_step_that_finishes_nothing_is_never_capped():
    s = priced(num_pages=1024, max_batch_tokens=512, costs_fn=costs(0.0, 1.0))
    s.add(make_req("a", list(range(900))))
    s.add(make_req("b", list(range(2000, 2300))))
    assert items(step(s)) == [("a", 0, 512, False)]
    # A finishes with 388 tokens: fixed cost 0 makes any packed token a loss, so B waits
    assert items(step(s)) == [("a", 512, 388, True)]
    assert items(step(s)) == [("a", 900, 1, True), ("b", 0, 300, True)]


def test_shortest_first_a_short_prompt_rides_along_a_long_one_waits():
    s = priced(num_pages=1024, max_batch_tokens=512, prefill_order="shortest")
    s.add(make_req("s1", list(range(40))))
    s.add(make_req("s2", list(range(100, 120))))
    s.add(make_req("long", list(range(3000, 4000))))
    # s2 finishes first; s1's 40 tokens cost it 74 ms, and left out s1 would wait a step with
    # 472 of long's tokens (0.9 s): in. long's chunk would not finish it: out, as one prompt
    # waiting does not make a 0.95 s step's worth of 30 ms steps
    assert items(step(s)) == [("s2", 0, 20, True), ("s1", 0, 40, True)]
    assert items(step(s)) == [("s2", 20, 1, True), ("s1", 40, 1, True), ("long", 0, 510, False)]


def test_before_a_fit_nothing_is_capped():
    s = priced(num_pages=1024, max_batch_tokens=512, costs_fn=lambda decodes: None)
    s.add(make_req("a", list(range(600))))
    step(s)
    s.add(make_req("b", list(range(1000, 1700))))
    assert items(step(s)) == [("a", 512, 88, True), ("b", 0, 424, False)]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("order", ["fcfs", "shortest", "ratio"])
def test_priced_schedules_change_no_token_and_lose_no_page(seed, order):
    """Random prompts sharing prefixes, a small pool (preemptions), random costs: every output is
    the pure function's, integrity holds after every step (``run``), every page comes back."""
    rng = random.Random(seed)
    fixed, token = rng.choice([0.0, 0.005, 0.03, 0.2]), rng.choice([0.0005, 0.002, 0.01])
    s = priced(
        costs(fixed, token),
        num_pages=48,
        max_batch_tokens=rng.choice([16, 32, 64]),
        max_running=rng.choice([2, 4, 8]),
        prefill_order=order,
    )
    stems = [[rng.randrange(1000) for _ in range(rng.randrange(4, 40))] for _ in range(3)]
    reqs, want = [], {}
    for i in range(12):
        prompt = rng.choice(stems) + [rng.randrange(1000) for _ in range(rng.randrange(1, 30))]
        n = rng.randrange(1, 6)
        reqs.append(make_req(f"r{i}", prompt, max_tokens=n))
        want[f"r{i}"] = expected_output(prompt, n)
    assert run(s, reqs) == want
    assert s.alloc.num_free + s.cache.total_tokens // s.P == s.alloc.num_pages


def test_packing_is_a_checked_setting():
    with pytest.raises(ValueError, match="packing must be one of priced, full, got 'half'"):
        SchedulerConfig(packing="half")


# ---------------------------------------------------------------- the engine


def test_the_engine_prices_with_its_own_fits_and_keeps_every_token():
    """The engine hands the scheduler its meter's fits; with costs that cap (here fixed, so the
    test does not depend on this machine's timings) its schedule changes and its greedy tokens
    do not."""
    from .test_engine import GREEDY, assert_no_leak, engine, shared_prefix_prompts, tokens

    e = engine(packing="priced", max_batch_tokens=32)
    assert e.scheduler.step_costs == e.meter.step_costs
    prompts = shared_prefix_prompts(seed=5, n=6)
    steps = {}
    for packing in ("full", "priced"):
        e = engine(packing=packing, max_batch_tokens=32)
        e.scheduler.step_costs = costs(0.01, 0.002)  # a step that finishes takes 5 more a prompt
        got = tokens(e.generate_batch(prompts, GREEDY))
        if packing == "full":
            want = got
        assert got == want
        steps[packing] = e.stats()["steps"]
        assert_no_leak(e)
    assert steps["priced"] > steps["full"]
