"""The queued prefill a worker reports (``QueuedPrefill``): what its queue will compute, net of
the cache and of the prefixes requests queued ahead compute first. Exact token counts."""

from __future__ import annotations

import random

import pytest

from radixray.protocol import SamplingParams
from radixray.worker.request import Request

from .test_scheduler import _tokens_per_step, make_req, make_sched, next_token, run

P = 4


def queued(s) -> int:
    return s.load()[2]


def test_a_waiting_request_counts_only_what_the_cache_does_not_hold():
    s = make_sched(num_pages=32, P=P)
    history = list(range(100, 118))  # 18 tokens: 4 full pages cached after the first turn
    run(s, [make_req("turn1", history, 2)])
    turn2 = make_req("turn2", history + [7, 7, 7], 2)  # 21 tokens, 16 of them cached
    s.add(turn2)
    assert turn2.queued_tokens == 21 - 16
    assert queued(s) == 5
    # and that is what admission computes
    batch = s.schedule()
    assert [(it.start, it.num_tokens) for it in batch.items] == [(16, 5)]


def test_the_last_page_of_a_cached_prompt_is_counted():
    s = make_sched(num_pages=32, P=P)
    prompt = list(range(16))
    run(s, [make_req("a", prompt, 1)])
    s.add(make_req("b", prompt, 1))
    # the last token is always computed, so only 3 of the 4 cached pages serve it
    assert queued(s) == 4


def test_requests_queued_behind_one_with_the_same_prefix_count_only_their_tails():
    s = make_sched(num_pages=64, P=P, prefill_order="fcfs")  # a, the first to arrive, starts
    shared = list(range(200, 232))  # 8 pages
    a = make_req("a", shared + [1, 2, 3], 1)
    b = make_req("b", shared + [4, 5, 6], 1)
    c = make_req("c", shared[:20] + [9] * 9, 1)  # shares 5 pages with a
    d = make_req("d", list(range(500, 510)), 1)  # shares nothing
    for r in (a, b, c, d):
        s.add(r)
    assert [r.queued_tokens for r in (a, b, c, d)] == [35, 3, 9, 10]
    assert queued(s) == 35 + 3 + 9 + 10
    # a starts: running prefills count what they have left, exactly
    batch = s.schedule()
    assert [it.req.request_id for it in batch.items][0] == "a"
    s.postprocess(batch)
    left = {r.request_id: r.num_tokens - r.num_computed - 1 for r in s.running if r.in_prefill}
    assert queued(s) == sum(left.values()) + sum(r.queued_tokens for r in s.waiting)


def test_the_estimate_is_what_a_same_prefix_burst_computes():
    """Requests arriving together, sharing prefixes in a tree of prompts: the sum of the
    estimates equals the prompt tokens the scheduler computes (nothing is evicted, and dedupe
    makes each follower wait for the pages the one ahead computes)."""
    rng = random.Random(5)
    s = make_sched(num_pages=512, P=P, max_batch_tokens=4096)
    roots = [[rng.randrange(1000) for _ in range(4 * rng.randint(2, 6))] for _ in range(3)]
    reqs = []
    for i in range(12):
        root = rng.choice(roots)
        keep = P * rng.randint(1, len(root) // P)
        tail = [rng.randrange(1000) for _ in range(rng.randint(1, 9))]
        reqs.append(make_req(f"r{i}", root[:keep] + tail, 1))
    for r in reqs:
        s.add(r)
    estimate = queued(s)
    assert estimate == sum(r.queued_tokens for r in reqs)
    assert estimate < sum(r.num_tokens for r in reqs)  # they share
    computed = 0
    while s.has_work():
        batch = s.schedule()
        computed += sum(it.num_tokens for it in batch.items if not it.req.output_ids)
        s.postprocess(batch)
        for it in batch.items:
            if it.sample:
                it.req.output_ids.append(next_token(it.req.all_ids))
                s.finish(it.req, "length")
        s.check_integrity()
    assert computed == estimate


def test_a_preempted_request_counts_what_it_must_recompute():
    s = make_sched(num_pages=6, P=P)
    a = make_req("a", list(range(8)), 8)
    b = make_req("b", list(range(50, 58)), 8)
    s.add(a)
    s.add(b)
    while s.num_preemptions == 0:
        batch = s.schedule()
        s.postprocess(batch)
        for it in batch.items:
            if it.sample:
                it.req.output_ids.append(next_token(it.req.all_ids))
    (victim,) = s.waiting
    # its computed pages went to the cache: it recomputes past them only
    cached = s.pages.peek(victim)
    assert cached > 0
    assert victim.queued_tokens == victim.num_tokens - cached


def test_a_request_that_left_the_queue_shares_nothing_with_later_arrivals():
    s = make_sched(num_pages=64, P=P, max_running=1)
    shared = list(range(300, 324))
    s.add(make_req("hold", list(range(900, 905)), 50))
    s.postprocess(s.schedule())  # hold runs; the next ones wait
    s.add(make_req("a", shared + [1], 1))
    assert s.abort("a") is not None
    late = make_req("late", shared + [2], 1)
    s.add(late)
    assert late.queued_tokens == 25  # a will not compute the shared pages any more


def test_chunk_cache_counts_whole_prompts():
    s = make_sched(num_pages=64, P=P, cache="chunk")
    prompt = list(range(20))
    run(s, [make_req("a", prompt, 1)])
    s.add(make_req("b", prompt, 1))
    s.add(make_req("c", prompt, 1))
    assert queued(s) == 40


def test_prompt_logprobs_requests_count_their_whole_prompt():
    s = make_sched(num_pages=64, P=P)
    prompt = list(range(20))
    run(s, [make_req("a", prompt, 1)])
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    r = Request("lp", list(prompt), params, make_req("x", prompt).block_hashes)
    s.add(r)
    assert r.queued_tokens == 20


@pytest.mark.parametrize("seed", range(2))
def test_the_page_map_is_rebuilt_and_stays_correct(seed):
    """Many requests come and go: the page map drops the pages of those that left (it stays
    bounded) and later estimates still see the prefixes of the requests still queued."""
    rng = random.Random(seed)
    s = make_sched(num_pages=2048, P=P, max_batch_tokens=4096)
    for k in range(30):
        run(
            s,
            [make_req(f"u{k}.{i}", [rng.randrange(1000) for _ in range(61)], 1) for i in range(20)],
        )
    assert len(s.queued._by_hash) <= 4096 + 15  # of 30 x 20 x 15 = 9,000 registered
    head = [rng.randrange(1000) for _ in range(40)]
    first = make_req("first", head + [1], 1)
    second = make_req("second", head + [2], 1)
    s.add(first)
    s.add(second)
    assert (first.queued_tokens, second.queued_tokens) == (41, 1)


def test_a_request_mid_prefill_is_reported_waiting_and_one_that_decodes_running():
    """``running`` is the requests that decode (each takes a token of every step's budget),
    ``waiting`` every other one not yet at its first token, mid-prefill included: the router's
    own tally's meaning (``router/traffic.py``), which its step costs read."""
    s = make_sched(num_pages=64, P=P, max_batch_tokens=8)
    short = make_req("short", list(range(5)), 20)  # one 5-token chunk, then decodes
    long_ = make_req("long", list(range(100, 130)), 4)  # 30 tokens: chunks of what is left
    s.add(short)
    s.add(long_)
    assert s.load()[:2] == (0, 2)
    _tokens_per_step(s, {}, 1)  # short's whole prompt and long's first 3 tokens
    assert short.output_ids and long_.in_prefill and len(s.running) == 2
    assert s.load()[:2] == (1, 1)  # long is running on the scheduler, waiting to a router
    while long_.in_prefill:  # its chunks, beside short's decodes (short has 20 to go)
        _tokens_per_step(s, {}, 1)
    assert s.load()[:2] == (2, 0)
