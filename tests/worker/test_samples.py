"""``n`` samples of one prompt on the engine (the tiny model): one prefill, all first tokens in
the prefill's step, each sample seeded ``seed + i`` and therefore equal, token for token, to a
request of its own with that seed; forks that find no room queue and still give the same
answers; aborts end every sample; no page leaks, in both cache modes."""

from __future__ import annotations

import asyncio
import re

import pytest

from radixray.protocol import GrammarSpec, InvalidRequest, SamplingParams, StreamChunk
from radixray.worker import Engine, EngineConfig

PROMPT = list(range(3, 41))  # 38 tokens: 9 full pages of 4 and a partial one


def _engine(**kw) -> Engine:
    # num_pages: unset, the pool is sized from free memory and checked whole after every step
    cfg = {"model": "tiny", "page_size": 4, "device": "cpu", "seed": 0, "debug_checks": True}
    return Engine(EngineConfig(**(cfg | {"num_pages": 2048} | kw)))


@pytest.fixture(scope="module", params=["radix", "chunk"])
def engine(request):
    return _engine(cache=request.param, num_pages=128)


def _sampled(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=8, temperature=1.0, seed=11, ignore_eos=True, n=n, **kw)


def _alone(engine: Engine, params: SamplingParams, i: int) -> list[int]:
    """Sample i's tokens as a request of its own (seed + i)."""
    p = params.replace(n=1, seed=params.seed + i)
    return engine.generate_batch([PROMPT], p)[0].token_ids


def _no_pages_held(engine: Engine) -> None:
    engine.check_integrity()
    s = engine.stats()
    assert s["running"] == s["waiting"] == 0
    assert s["free_pages"] + s["evictable_pages"] == s["total_pages"]


def test_each_sample_equals_its_own_seeded_request(engine):
    params = _sampled(4)
    outs = engine.generate_batch([PROMPT], params)
    assert [c.index for c in outs] == [0, 1, 2, 3]
    assert all(c.prompt_tokens == len(PROMPT) and c.completion_tokens == 8 for c in outs)
    assert len({tuple(c.token_ids) for c in outs}) == 4  # seeded apart
    assert [c.token_ids for c in outs] == [_alone(engine, params, i) for i in range(4)]
    again = engine.generate_batch([PROMPT], params)
    assert [c.token_ids for c in again] == [c.token_ids for c in outs]
    _no_pages_held(engine)


def test_one_prefill_and_every_first_token_in_its_step():
    eng = _engine(num_pages=128)
    one = _engine(num_pages=128)
    params = SamplingParams(max_tokens=1, temperature=1.0, seed=3, n=8)
    outs = eng.generate_batch([PROMPT], params)
    ref = one.generate_batch([PROMPT], params.replace(n=1))[0]
    assert len(outs) == 8 and all(c.completion_tokens == 1 for c in outs)
    assert outs[0].token_ids == ref.token_ids
    # The prompt was computed once, in as many steps as one sample takes.
    assert eng.meter.prefill_tokens == one.meter.prefill_tokens == len(PROMPT)
    assert eng.meter.steps == one.meter.steps
    assert eng.meter.requests_finished == 1
    _no_pages_held(eng)


def test_greedy_samples_are_the_greedy_answer():
    eng = _engine(num_pages=128)
    greedy = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    ref = eng.generate_batch([PROMPT], greedy)[0].token_ids
    outs = eng.generate_batch([PROMPT], greedy.replace(n=3))
    assert [c.token_ids for c in outs] == [ref] * 3


@pytest.mark.parametrize("limit", [{"max_running": 2}, {"num_pages": 16}])
def test_forks_without_room_queue_and_answer_the_same(limit):
    """max_running 2, or 16 pages of 4 (a sample needs 12): some forks cannot start with their
    leader; they wait, are admitted on the cached prompt (or preempt each other), and each
    sample still equals its own seeded request."""
    eng = _engine(**limit)
    params = _sampled(4)
    outs = eng.generate_batch([PROMPT], params)
    assert [c.token_ids for c in outs] == [_alone(eng, params, i) for i in range(4)]
    _no_pages_held(eng)


def test_prompt_lists_and_ns_mix_in_one_batch():
    eng = _engine(num_pages=128)
    a, b = PROMPT, [7, 8, 9, 10, 11, 12]
    pa, pb = _sampled(2), _sampled(3).replace(seed=5)
    outs = eng.generate_batch([a, b], [pa, pb])
    assert [(len(c.token_ids), c.prompt_tokens, c.index) for c in outs] == [
        (8, len(a), 0), (8, len(a), 1), (8, len(b), 0), (8, len(b), 1), (8, len(b), 2)
    ]  # fmt: skip
    alone = [eng.generate_batch([b], pb.replace(n=1, seed=5 + i))[0].token_ids for i in range(3)]
    assert [c.token_ids for c in outs[2:]] == alone


def _stream(engine: Engine, params: SamplingParams, abort_after: int | None = None):
    """The request's chunks through ``engine.generate`` (the loop's thread)."""

    async def run() -> list[StreamChunk]:
        got = []
        agen = engine.generate(PROMPT, params, request_id="s")
        async for c in agen:
            got.append(c)
            if abort_after is not None and len(got) == abort_after:
                engine.loop.abort("s")
        return got

    return asyncio.run(run())


def test_streamed_samples_carry_their_index_and_the_last_end_is_final():
    eng = _engine(num_pages=128)
    params = _sampled(3)
    try:
        chunks = _stream(eng, params)
    finally:
        eng.shutdown()
    assert chunks[-1].final and sum(c.final for c in chunks) == 1
    ends = [c for c in chunks if c.ended]
    assert sorted(c.index for c in ends) == [0, 1, 2]
    assert [c.samples_open for c in ends] == [2, 1, 0]
    tokens = {i: [t for c in chunks if c.index == i for t in c.token_ids] for i in range(3)}
    assert [tokens[i] for i in range(3)] == [
        c.token_ids for c in eng.generate_batch([PROMPT], params)
    ]


def test_an_abort_ends_every_sample_and_frees_every_page():
    eng = _engine(num_pages=128)
    try:
        chunks = _stream(eng, _sampled(3).replace(max_tokens=200), abort_after=2)
        ends = [c for c in chunks if c.ended]
        assert sorted(c.index for c in ends) == [0, 1, 2]
        assert {c.finish_reason for c in ends} == {"abort"} and chunks[-1].final
        _no_pages_held(eng)
    finally:
        eng.shutdown()


def test_an_abort_before_the_fork_ends_the_samples_that_never_started():
    eng = _engine(num_pages=128, max_batch_tokens=8)  # the prompt takes 5 steps
    eng.add_request(PROMPT, _sampled(3), request_id="early")
    eng.step()
    last = eng.abort("early")
    assert last.final and last.index == 2 and last.finish_reason == "abort"
    assert eng.meter.requests_aborted == 1
    _no_pages_held(eng)


def test_prompt_logprobs_and_grammar_go_to_every_sample():
    eng = _engine(num_pages=128)
    pattern = r"[a-z]{2,4}-[0-9]{2}"
    params = _sampled(3, prompt_logprobs=1, logprobs=0).replace(
        grammar=GrammarSpec("regex", pattern), ignore_eos=False, max_tokens=30
    )
    chunks: list[StreamChunk] = []
    eng.add_request("id:", params, request_id="g")
    while eng.has_work():
        chunks += eng.step()
    firsts = {}
    for c in chunks:
        firsts.setdefault(c.index, c)
    plps = [firsts[i].prompt_logprobs for i in range(3)]
    assert plps[0] is not None and plps[0][0] is None and plps == [plps[0]] * 3
    texts = ["".join(c.text for c in chunks if c.index == i) for i in range(3)]
    assert all(re.fullmatch(pattern, t) for t in texts), texts
    assert all(len(c.logprobs) == len(c.token_ids) for c in chunks if c.token_ids)


@pytest.mark.parametrize("bad", [0, 129, True, 1.5])
def test_bad_n_is_refused_naming_it(bad):
    with pytest.raises(InvalidRequest) as e:
        SamplingParams(n=bad)
    assert e.value.param == "n" and "[1, 128]" in e.value.message


def test_seeds_wrap_at_the_top_of_the_range():
    eng = _engine(num_pages=128)
    top = 2**63 - 1
    outs = eng.generate_batch([PROMPT], _sampled(2).replace(seed=top))
    wrapped = eng.generate_batch([PROMPT], _sampled(1).replace(seed=-(2**63)))[0]
    assert outs[1].token_ids == wrapped.token_ids
