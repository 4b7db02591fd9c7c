"""Priced packing (worker/packing.py): how much more prefill a step takes once it finishes a
prompt. The arithmetic, the scheduler's exact chunks with it and without, and that no schedule it
makes changes a token or loses a page."""

from __future__ import annotations

import random

import pytest

from radixray.cache_index import PageAllocator, RadixCache
from radixray.step_cost import StepCostModel
from radixray.worker.packing import StepPacking, fitted_step_costs
from radixray.worker.scheduler import Scheduler, SchedulerConfig

from .test_scheduler import expected_output, make_req, run

CPU = (0.0301, 0.001855)  # the cpu preset's step overhead and seconds per prefill token


def costs(fixed_s=CPU[0], token_s=CPU[1]):
    return lambda decodes: (fixed_s, token_s)


def priced(costs_fn=None, num_pages=1024, **cfg):
    """A scheduler given step costs as the engine gives it its fits (P = 4)."""
    cache = RadixCache(4, PageAllocator(num_pages))
    return Scheduler(cache, SchedulerConfig(**cfg), costs_fn or costs())


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
    p = StepPacking(costs(0.03, 0.002))
    assert p.limit(500, 1) == 500  # nothing finishes yet: a full step
    p.note(1, decode=True, finishes=True)  # a decode never counts as a prompt finishing
    p.note(100, decode=False, finishes=False)  # a chunk that does not finish its prompt
    assert p.limit(500, 1) == 500
    p.note(40, decode=False, finishes=True)
    assert p.limit(500, 1) == 15  # 1 waiting x 30 ms / (1 finishing x 2 ms)
    assert p.limit(500, 3) == 45
    assert p.limit(10, 3) == 10  # never more than the budget
    p.note(5, decode=False, finishes=False)  # tokens after the first finish count against it
    assert p.limit(500, 3) == 40
    p.note(5, decode=False, finishes=True)  # two finishing: each packed token delays both
    assert p.limit(500, 3) == 12  # int(3 * 0.03 / (2 * 0.002)) - 10
    assert p.limit(500, 1) == 0
    assert StepPacking(None).limit(500, 1) == 500  # full packing, or no fit yet


# ---------------------------------------------------------------- the scheduler


def test_a_lone_prompt_behind_a_finishing_one_waits_a_short_step():
    """A's last 88 tokens finish in step 2; B arrived during step 1. Full packing fills the step
    with 424 of B's tokens (A's first token waits ~0.8 s more on the cpu preset); priced packing
    gives B what its one step of overhead saved is worth: 30.1 ms / 1.855 ms = 16 tokens."""
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
    assert by_rule["priced"] == [("a", 512, 88, True), ("b", 0, 16, False)]


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


def test_shortest_first_caps_the_admissions_after_a_finish():
    s = priced(num_pages=1024, max_batch_tokens=512, prefill_order="shortest")
    s.add(make_req("short", list(range(40))))
    s.add(make_req("long", list(range(3000, 3400))))
    # the short prompt finishes first; the long one, the only prompt left waiting, gets what
    # its one step of overhead is worth: int(30.1 / 1.855) = 16 tokens
    assert items(step(s)) == [("short", 0, 40, True), ("long", 0, 16, False)]


def test_before_a_fit_nothing_is_capped():
    s = priced(num_pages=1024, max_batch_tokens=512, costs_fn=lambda decodes: None)
    s.add(make_req("a", list(range(600))))
    step(s)
    s.add(make_req("b", list(range(1000, 1700))))
    assert items(step(s)) == [("a", 512, 88, True), ("b", 0, 424, False)]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("order", ["fcfs", "shortest"])
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
