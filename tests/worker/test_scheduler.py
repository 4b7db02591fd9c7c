"""Scheduler tests on ints and lists: exact page ids, chunking, preemption, attribution.

The "model" here is a pure function of the token sequence (next = f(all tokens so far)), so the
token stream a request produces must not depend on batching, caching or preemption; what is
checked is the scheduler's bookkeeping. The real-model exactness tests live in test_engine.py.
"""

from __future__ import annotations

import random

import pytest

from radixray.cache_index import ChunkCache, PageAllocator, RadixCache, hash_blocks
from radixray.protocol import MISS_CAUSES, SamplingParams
from radixray.worker.request import Request, RequestStatus
from radixray.worker.scheduler import Scheduler, SchedulerConfig

VOCAB = 1000


def next_token(tokens: list[int]) -> int:
    h = 17
    for t in tokens:
        h = (h * 31 + t) % 1_000_003
    return h % VOCAB


def make_req(rid: str, prompt: list[int], max_tokens: int = 4, P: int = 4) -> Request:
    return Request(
        rid,
        list(prompt),
        SamplingParams(max_tokens=max_tokens, temperature=0.0),
        hash_blocks(prompt, P),
    )


def run(sched: Scheduler, reqs: list[Request], max_steps: int = 10_000) -> dict[str, list[int]]:
    """Drive the scheduler like the engine does; check integrity after every step."""
    for r in reqs:
        sched.add(r)
    done: dict[str, list[int]] = {}
    for _ in range(max_steps):
        if not sched.has_work():
            break
        batch = sched.schedule()
        for it in batch.items:
            # The pages must cover every position computed this step.
            assert len(it.req.pages) * sched.P >= it.start + it.num_tokens
        sched.postprocess(batch)
        for it in batch.items:
            if it.sample:
                r = it.req
                r.output_ids.append(next_token(r.all_ids))
                if len(r.output_ids) >= r.params.max_tokens:
                    sched.finish(r, "length")
                    done[r.request_id] = list(r.output_ids)
        sched.check_integrity()
    assert not sched.has_work()
    return done


def expected_output(prompt: list[int], n: int) -> list[int]:
    seq, out = list(prompt), []
    for _ in range(n):
        t = next_token(seq)
        out.append(t)
        seq.append(t)
    return out


def make_sched(num_pages=64, P=4, cache="radix", step_costs=None, **cfg) -> Scheduler:
    alloc = PageAllocator(num_pages)
    c = RadixCache(P, alloc) if cache == "radix" else ChunkCache(P, alloc)
    return Scheduler(c, SchedulerConfig(**cfg), step_costs)


def test_single_request_exact_pages_and_release():
    s = make_sched(num_pages=8, P=4)
    r = make_req("a", list(range(10)), max_tokens=3)
    s.add(r)
    b = s.schedule()
    assert [(it.start, it.num_tokens, it.sample) for it in b.items] == [(0, 10, True)]
    assert r.pages == [0, 1, 2]
    s.postprocess(b)
    # Prefill progress went to the cache: the 2 full pages are the tree's now, page 2 private.
    assert r.num_tree_pages == 2 and r.private_pages == [2]
    assert s.cache.total_tokens == 8 and s.cache.protected_tokens == 8
    s.check_integrity()
    r.output_ids.append(5)
    s.finish(r, "length")
    s.check_integrity()
    # 11 tokens with KV computed -> 2 full pages stay cached, the tail page is free again.
    assert s.cache.total_tokens == 8 and s.cache.protected_tokens == 0
    assert s.alloc.num_free == 6


def test_second_request_reuses_and_attribution():
    P = 4
    s = make_sched(num_pages=32, P=P)
    prompt = list(range(100, 118))  # 18 tokens: 4 full pages + 2 tail
    run(s, [make_req("a", prompt, 2)])
    r = make_req("b", prompt + [7, 7], 2)  # 20 tokens, 5 full pages; 4 of them cached
    s.add(r)
    b = s.schedule()
    assert b.items[0].start == 16
    assert r.miss == {
        "cached": 16,
        "cold": 0,
        "evicted": 0,
        "page_tail": 4,
        "in_flight": 0,
        "disabled": 0,
        "host": 0,
        "window": 0,
        "state": 0,
    }
    assert sum(r.miss.values()) == r.num_prompt


def test_page_aligned_prompt_recomputes_last_page():
    s = make_sched(num_pages=32, P=4)
    prompt = list(range(16))
    run(s, [make_req("a", prompt, 1)])
    r = make_req("b", prompt, 1)
    s.add(r)
    b = s.schedule()
    # The last token's logits are needed: only 3 of the 4 cached pages can be used.
    assert b.items[0].start == 12
    assert r.miss["cached"] == 12 and r.miss["page_tail"] == 4


def test_chunked_prefill_respects_budget_and_shares_progress():
    P = 4
    s = make_sched(num_pages=64, P=P, max_batch_tokens=8)
    r = make_req("a", list(range(30)), 2)
    s.add(r)
    starts = []
    while r.status is not RequestStatus.FINISHED:
        b = s.schedule()
        assert b.num_tokens <= 8
        starts += [(it.start, it.num_tokens) for it in b.items]
        s.postprocess(b)
        for it in b.items:
            if it.sample:
                r.output_ids.append(1)
                if len(r.output_ids) == 2:
                    s.finish(r, "length")
        s.check_integrity()
    assert starts == [(0, 8), (8, 8), (16, 8), (24, 6), (30, 1)]


def test_same_prefix_arrivals_one_prefills_the_others_reuse():
    P = 4
    s = make_sched(num_pages=64, P=P)
    shared = list(range(200, 232))  # 8 pages
    a = make_req("a", shared + [1, 2, 3], 1)
    b = make_req("b", shared + [4, 5, 6], 1)
    s.add(a)
    s.add(b)
    first = s.schedule()
    assert [it.req.request_id for it in first.items] == ["a"]
    s.postprocess(first)
    second = s.schedule()
    assert [(it.req.request_id, it.start) for it in second.items if it.req is b] == [("b", 32)]
    assert b.miss["cached"] == 32 and b.miss["in_flight"] == 0


def test_same_prefix_without_dedupe_is_in_flight():
    s = make_sched(num_pages=64, P=4, dedupe_in_flight=False)
    shared = list(range(200, 232))
    a = make_req("a", shared + [1, 2, 3], 1)
    b = make_req("b", shared + [4, 5, 6], 1)
    s.add(a)
    s.add(b)
    batch = s.schedule()
    assert {it.req.request_id for it in batch.items} == {"a", "b"}
    assert b.miss["in_flight"] == 32 and b.miss["cached"] == 0
    s.postprocess(batch)  # b's duplicate pages are freed when it commits
    s.check_integrity()


def test_evicted_attribution_uses_ghost_list():
    P = 4
    s = make_sched(num_pages=12, P=P)
    p1 = list(range(32))
    run(s, [make_req("a", p1, 1)])
    run(s, [make_req(f"fill{i}", list(range(1000 + 40 * i, 1032 + 40 * i)), 1) for i in range(3)])
    r = make_req("again", p1, 1)
    s.add(r)
    s.schedule()
    assert r.miss["evicted"] > 0
    assert r.miss["cached"] + r.miss["evicted"] + r.miss["cold"] + r.miss["page_tail"] == 32


def test_chunk_cache_attributes_disabled_and_never_caches():
    s = make_sched(num_pages=32, P=4, cache="chunk")
    prompt = list(range(20))
    run(s, [make_req("a", prompt, 2)])
    r = make_req("b", prompt, 2)
    s.add(r)
    s.schedule()
    assert r.miss == dict.fromkeys(MISS_CAUSES, 0) | {"disabled": 20}


def test_preemption_keeps_prefix_and_readmission_hits():
    P = 4
    # 6 pages: two requests of 8-token prompts growing to 16 tokens cannot both fit.
    s = make_sched(num_pages=6, P=P)
    a = make_req("a", list(range(8)), 8)
    b = make_req("b", list(range(50, 58)), 8)
    out = run(s, [a, b])
    assert s.num_preemptions >= 1
    assert out["a"] == expected_output(list(range(8)), 8)
    assert out["b"] == expected_output(list(range(50, 58)), 8)
    assert s.alloc.num_free + s.cache.total_tokens // P == 6


def test_prompt_larger_than_pool_is_rejected():
    s = make_sched(num_pages=4, P=4)
    with pytest.raises(ValueError, match="exceeds the KV pool"):
        s.add(make_req("big", list(range(15)), 4))


def test_abort_waiting_and_running_frees_everything():
    s = make_sched(num_pages=16, P=4, max_running=1)
    a = make_req("a", list(range(10)), 50)
    b = make_req("b", list(range(20, 30)), 50)
    s.add(a)
    s.add(b)
    s.postprocess(s.schedule())
    assert s.abort("b") is b and b.finish_reason == "abort"
    assert s.abort("a") is a
    assert s.abort("nope") is None
    s.check_integrity()
    assert s.alloc.num_free + s.cache.total_tokens // 4 == 16
    assert s.cache.protected_tokens == 0


def _tokens_per_step(s: Scheduler, reqs_by_step: dict[int, list[Request]], steps: int):
    """Drive ``s`` for ``steps`` steps, adding ``reqs_by_step[k]`` before step k; returns each
    step's {request id: tokens computed}."""
    log = []
    for k in range(steps):
        for r in reqs_by_step.get(k, []):
            s.add(r)
        batch = s.schedule()
        log.append({it.req.request_id: it.num_tokens for it in batch.items})
        s.postprocess(batch)
        for it in batch.items:
            if it.sample:
                it.req.output_ids.append(next_token(it.req.all_ids))
                if len(it.req.output_ids) >= it.req.params.max_tokens:
                    s.finish(it.req, "length")
        s.check_integrity()
    return log


@pytest.mark.parametrize("order", ["fcfs", "shortest", "ratio"])
def test_a_short_prompt_behind_a_long_prefill(order):
    # A 64-token prompt prefills 8 tokens a step; a 5-token prompt arrives at its third step.
    s = make_sched(num_pages=64, P=4, max_batch_tokens=8, prefill_order=order)
    long_ = make_req("long", list(range(64)), 4)
    short = make_req("short", list(range(100, 105)), 4)
    log = _tokens_per_step(s, {0: [long_], 2: [short]}, 5)
    assert log[:2] == [{"long": 8}, {"long": 8}]
    if order == "fcfs":  # the running prefill keeps the whole budget
        assert log[2:] == [{"long": 8}] * 3
    elif order == "shortest":  # the short prompt goes first, the long one takes what is left
        assert log[2:] == [{"short": 5, "long": 3}] + [{"short": 1, "long": 7}] * 2
    else:  # ratio: on arrival the short one's ratio is 1, the long one's (16 + 48) / 48; a step
        # later (8 + 5) / 5 against (24 + 40) / 40, and the short one goes first
        assert log[2:] == [{"long": 8}, {"short": 5, "long": 3}, {"short": 1, "long": 7}]
    assert long_.num_computed == {"fcfs": 40, "shortest": 33, "ratio": 34}[order]


@pytest.mark.parametrize("order", ["shortest", "ratio"])
def test_a_long_prefill_behind_a_stream_of_short_prompts(order):
    """An 8-token prompt arrives every step behind a 40-token one, on 8-token steps. Shortest
    first holds the long prompt until it has waited ``max_wait_steps``; by response ratio
    (waited + left) / left its wait counts for it, and it finishes while no short prompt waits
    more than two steps."""
    s = make_sched(num_pages=256, P=4, max_batch_tokens=8, max_wait_steps=100,
                   prefill_order=order)  # fmt: skip
    long_ = make_req("long", list(range(40)), 1)
    shorts = {k: [make_req(f"s{k}", list(range(200 + 10 * k, 208 + 10 * k)), 1)]
              for k in range(1, 9)}  # fmt: skip
    log = _tokens_per_step(s, {0: [long_]} | shorts, 9)
    if order == "shortest":
        assert log == [{"long": 8}] + [{f"s{k}": 8} for k in range(1, 9)]
        return
    # step 1: s1 (0 + 8) / 8 against long (8 + 32) / 32; step 2: s1 (8 + 8) / 8 first; step 3:
    # s2 2 ties long (24 + 24) / 24, the shorter first; steps 4-6: long 56 / 24, 56 / 16, 56 / 8
    assert log == [{"long": 8}, {"long": 8}, {"s1": 8}, {"s2": 8}, {"long": 8}, {"long": 8},
                   {"long": 8}, {"s3": 8}, {"s4": 8}]  # fmt: skip


def test_shortest_first_lets_a_request_that_waited_long_enough_go_first():
    s = make_sched(num_pages=128, P=4, max_batch_tokens=8, max_wait_steps=4,
                   prefill_order="shortest")  # fmt: skip
    long_ = make_req("long", list(range(40)), 1)
    shorts = {k: [make_req(f"s{k}", list(range(200 + 10 * k, 208 + 10 * k)), 1)]
              for k in range(1, 8)}  # fmt: skip
    log = _tokens_per_step(s, {0: [long_]} | shorts, 8)
    # Step 0 starts the long prefill; from step 1 an 8-token prompt arrives every step and takes
    # the budget, until the long one has waited 4 steps (step 3 on): then it goes first.
    assert log[0] == {"long": 8}
    assert log[1] == {"s1": 8} and log[2] == {"s2": 8}
    assert log[3:7] == [{"long": 8}] * 4, log
    assert log[7] == {"s3": 8}  # the queue behind it: the oldest first


def test_prefill_order_is_checked():
    with pytest.raises(ValueError, match="must be one of fcfs, shortest, ratio, got 'lifo'"):
        SchedulerConfig(prefill_order="lifo")


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("cache", ["radix", "chunk"])
@pytest.mark.parametrize("order", ["fcfs", "shortest", "ratio"])
def test_random_workload_exact_outputs_and_no_leak(seed, cache, order):
    rng = random.Random(seed)
    P = rng.choice([1, 2, 4, 8])
    num_pages = rng.randint(40, 120) // P + 8
    s = make_sched(
        num_pages=num_pages,
        P=P,
        cache=cache,
        max_batch_tokens=rng.choice([4, 16, 64]),
        max_running=rng.choice([2, 8, 64]),
        prefill_order=order,
    )
    systems = [[rng.randrange(VOCAB) for _ in range(rng.randint(0, 20))] for _ in range(3)]
    reqs = []
    for i in range(30):
        prompt = rng.choice(systems) + [rng.randrange(VOCAB) for _ in range(rng.randint(1, 12))]
        n = rng.randint(1, 8)
        if len(prompt) + n > num_pages * P:
            continue
        reqs.append(make_req(f"r{i}", prompt, n, P))
    want = {r.request_id: expected_output(r.prompt_ids, r.params.max_tokens) for r in reqs}
    got = run(s, reqs)
    assert got == want
    assert s.alloc.num_free + s.cache.total_tokens // P == num_pages
    assert s.cache.protected_tokens == 0
