"""The overlapped step (worker/overlap.py) against the serial loop, on the tiny model (CPU: the
device work runs on a thread of its own).

Greedy and seeded outputs must be the serial loop's whatever ends a request (length, EOS, a stop
token or string, an abort) and whatever happened on the way (reuse, eviction, preemption, forks,
grammars, penalties, logprobs, the host tier); the tokens computed past a request's end are never
emitted nor cached, and no page leaks.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from radixray.protocol import GrammarSpec
from radixray.worker import Engine, EngineConfig, SamplingParams
from radixray.worker.engine import EngineError
from tests.worker.test_engine import POOL_TOKENS, assert_no_leak, shared_prefix_prompts


def engine(overlap: str, **kw) -> Engine:
    cfg = {"model": "tiny", "page_size": 4, "device": "cpu", "seed": 0, "debug_checks": True}
    cfg.update(kw)
    cfg.setdefault("num_pages", POOL_TOKENS // cfg["page_size"])
    return Engine(EngineConfig(overlap=overlap, **cfg))


def corpus(seed: int, n: int = 14):
    """Prompts sharing prefixes, and parameters that end them every way: length, EOS off, a
    stop token the model will sample (found by a greedy run), seeded sampling."""
    prompts = shared_prefix_prompts(seed, n)
    rng = random.Random(seed)
    params = []
    for i in range(n):
        kw = {"max_tokens": rng.randint(1, 14), "ignore_eos": True, "temperature": 0.0}
        if i % 3 == 1:
            kw.update(temperature=0.9, top_p=0.95, seed=100 + i)
        params.append(SamplingParams(**kw))
    return prompts, params


def with_stops(e: Engine, prompts, params):
    """Each greedy request also stops at the token it samples third, when it gets that far:
    requests end on a token no length check foresees."""
    outs = e.generate_batch(prompts, params)
    return [
        p.replace(stop_token_ids=[o.token_ids[2]]) if p.greedy and len(o.token_ids) > 3 else p
        for p, o in zip(params, outs, strict=True)
    ]


def run(e: Engine, prompts, params):
    outs = e.generate_batch(prompts, params)
    return [(o.token_ids, o.finish_reason, o.completion_tokens) for o in outs]


def cached_blocks(e: Engine) -> set[int]:
    """The hashes of every cached page (chained: equal sets are equal cached prefixes)."""
    return {h for ev in e.snapshot_events()[1:] for h in ev.block_hashes}


CONFIGS = [
    {"cache": "chunk"},
    {"cache": "radix"},
    {"cache": "radix", "page_size": 1, "max_batch_tokens": 16},
    # a pool of a few prompts: eviction and preemption while tokens are on the device
    {"cache": "radix", "num_pages": 26, "max_batch_tokens": 32},
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_overlapped_outputs_pages_and_cache_equal_the_serial_loop(cfg):
    prompts, params = corpus(seed=len(cfg))
    probe = engine("off", **cfg)
    params = with_stops(probe, prompts, params)
    probe.shutdown()
    serial, over = engine("off", **cfg), engine("on", **cfg)
    try:
        for _ in range(2):  # cold, then on what the first pass cached
            want = run(serial, prompts, params)
            assert run(over, prompts, params) == want
        assert any(r == "stop" for _, r, _ in want)
        # a token is computed past an end only where the end was not known at launch (a stop)
        stops = sum(r == "stop" for _, r, _ in want)
        assert 0 < over.overlap.discarded <= 2 * stops
        assert over.overlap.overlapped_steps > 0 and over.overlap.serial_steps == 0
        assert over.overlap.inflight is None and not over.has_work()
        assert_no_leak(over)
        if cfg.get("num_pages"):
            assert over.stats()["preemptions"] > 0
        else:  # nothing computed past an end reached the cache
            assert cached_blocks(over) == cached_blocks(serial)
            assert over.cache.total_tokens == serial.cache.total_tokens
    finally:
        serial.shutdown()
        over.shutdown()


def test_steps_that_need_the_last_token_run_serially_and_equal_it():
    grammar = GrammarSpec("json_object")
    cases = [
        SamplingParams(max_tokens=12, temperature=0.0, grammar=grammar),
        SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, repetition_penalty=1.3),
        SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, frequency_penalty=0.5),
        SamplingParams(max_tokens=12, temperature=0.8, seed=3, ignore_eos=True, n=3),
        SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, prompt_logprobs=2),
        SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=3),
        SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True),
    ]
    prompts = shared_prefix_prompts(seed=5, n=len(cases))
    serial, over = engine("off"), engine("on")
    try:
        want = serial.generate_batch(prompts, cases)
        got = over.generate_batch(prompts, cases)
        assert [(c.token_ids, c.finish_reason, c.index) for c in got] == [
            (c.token_ids, c.finish_reason, c.index) for c in want
        ]
        assert over.overlap.serial_steps > 0
        assert_no_leak(over)
    finally:
        serial.shutdown()
        over.shutdown()


def test_logprobs_of_overlapped_steps_equal_the_serial_ones():
    p = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=2)
    prompts = shared_prefix_prompts(seed=2, n=4)
    serial, over = engine("off"), engine("on")
    try:
        want = asyncio.run(_chunks(serial, prompts[0], p))
        got = asyncio.run(_chunks(over, prompts[0], p))
        # (flattened: how tokens group into chunks depends on when the reader asks)
        assert [x for c in got for x in c.logprobs] == [x for c in want for x in c.logprobs]
        assert [t for c in got for t in c.token_ids] == [t for c in want for t in c.token_ids]
        assert over.overlap.overlapped_steps > 0
    finally:
        serial.shutdown()
        over.shutdown()


async def _chunks(e: Engine, prompt, params):
    return [c async for c in e.generate(prompt, params)]


def test_the_host_tier_moves_pages_only_in_serial_steps_and_outputs_stay_exact():
    prompts = shared_prefix_prompts(seed=7, n=16)
    greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    kw = {"num_pages": 30, "host_pages": 200, "max_batch_tokens": 32}
    serial, over = engine("off", **kw), engine("on", **kw)
    try:
        for _ in range(2):
            assert run(over, prompts, greedy) == run(serial, prompts, greedy)
        s = over.stats()
        assert s["demoted_pages"] > 0 and s["loaded_pages"] > 0, s
        assert over.overlap.serial_steps > 0 and over.overlap.overlapped_steps > 0
        assert_no_leak(over)
    finally:
        serial.shutdown()
        over.shutdown()


def test_an_abort_while_a_step_is_on_the_device_frees_its_pages():
    e = engine("on", max_batch_tokens=8)
    try:
        short = e.add_request([3, 4, 5], SamplingParams(max_tokens=50, temperature=0.0))
        long = e.add_request(list(range(3, 60)), SamplingParams(max_tokens=50, temperature=0.0))
        for _ in range(4):
            e.step()
        assert e.overlap.inflight is not None
        assert e.abort(short).finish_reason == "abort"
        e.step()
        assert e.abort(long).finish_reason == "abort"
        while e.has_work():
            assert e.step() == []  # what was on the device for them is dropped
        assert_no_leak(e)
    finally:
        e.shutdown()


def test_decode_graph_buffers_take_the_device_ids():
    """The graphs' static-buffer forward (``capture=False``: eager, any device) gets the pending
    ids on the device, as a replay would."""
    prompts = shared_prefix_prompts(seed=3, n=6)
    greedy = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    serial, over = engine("off"), engine("on")
    over.runner.use_graphs(8, over.max_model_len, capture=False)
    try:
        assert run(over, prompts, greedy) == run(serial, prompts, greedy)
        assert over.runner.graphs.replays > 0 and over.overlap.overlapped_steps > 0
    finally:
        serial.shutdown()
        over.shutdown()


def test_a_failed_device_step_fails_its_requests_and_the_engine_goes_on():
    e = engine("on")
    greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    try:
        ref = e.generate_batch(["after the failure"], greedy)[0]
        real = e.runner.forward

        def boom(*a, **kw):
            e.runner.forward = real
            raise RuntimeError("injected forward failure")

        e.runner.forward = boom
        with pytest.raises(EngineError, match="injected forward failure"):
            asyncio.run(_chunks(e, "this one fails", greedy))
        assert e.alive and e.overlap.inflight is None
        chunks = asyncio.run(_chunks(e, "after the failure", greedy))
        assert [t for c in chunks for t in c.token_ids] == ref.token_ids
        e.shutdown()
        assert_no_leak(e)
    finally:
        e.shutdown()


def test_overlap_setting():
    import torch

    assert EngineConfig(overlap="auto").overlapped(torch.device("cuda"))
    assert not EngineConfig(overlap="auto").overlapped(torch.device("cpu"))
    assert EngineConfig(overlap="on").overlapped(torch.device("cpu"))
    assert not EngineConfig(overlap="off").overlapped(torch.device("cuda"))
    with pytest.raises(ValueError, match="overlap must be 'auto', 'on' or 'off', got 'yes'"):
        EngineConfig(overlap="yes")


def test_penalties_and_min_tokens_overlap_and_equal_the_serial_loop():
    """Their counts stay on the device (the sampler's), so their steps need no host tokens."""
    prompts = shared_prefix_prompts(seed=9, n=6)
    params = [
        SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True, repetition_penalty=1.4),
        SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True, frequency_penalty=0.8),
        SamplingParams(max_tokens=14, temperature=0.9, seed=2, ignore_eos=True, presence_penalty=1),
        SamplingParams(max_tokens=14, temperature=0.0, min_tokens=10, logit_bias={7: 5.0}),
        SamplingParams(max_tokens=14, temperature=0.8, seed=5, min_p=0.1, ignore_eos=True),
        SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True),
    ]
    serial, over = engine("off"), engine("on")
    try:
        assert run(over, prompts, params) == run(serial, prompts, params)
        assert over.overlap.serial_steps == 0 and over.overlap.overlapped_steps > 0
        assert_no_leak(over)
    finally:
        serial.shutdown()
        over.shutdown()


@pytest.mark.gpu
def test_an_overlapped_launch_never_waits_for_the_device():
    """On CUDA a decode step's launch (the inputs, the graph's replay, sampling, the ids' copy
    back) queues work and returns: nothing in it synchronises with the device
    (``torch.cuda.set_sync_debug_mode`` raises on any call that would), or the host would wait
    for the step in flight. (Prefill launches are not held to it here.)"""
    import torch

    e = engine("on", device="cuda", dtype="bfloat16", debug_checks=False)
    launch = e.overlap._launch
    checked = [0]

    def strict(batch, *a, **kw):
        if not all(it.num_tokens == 1 for it in batch.items):
            return launch(batch, *a, **kw)
        torch.cuda.set_sync_debug_mode("error")
        try:
            return launch(batch, *a, **kw)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            checked[0] += 1

    try:
        greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
        want = run(engine("off", device="cuda", dtype="bfloat16"), ["a b c", "d e"], greedy)
        e.generate_batch(["warm up"], greedy)  # Triton compiles, graphs are captured
        e.overlap._launch = strict
        assert run(e, ["a b c", "d e"], greedy) == want
        assert checked[0] > 10
    finally:
        e.shutdown()
