"""Logprobs on the engine (the tiny model) against a float64 reference: the log-softmax of the
raw last-position logits of each prefix, taken through the plain sampling path (one request of
max_tokens=1 per prefix), so neither the batched top-k nor the prompt rows are trusted."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixray.protocol import InvalidRequest, SamplingParams, StreamChunk, TokenLogprob
from radixray.worker import Engine, EngineConfig
from radixray.worker.logprobs import token_logprobs

TOL = 1e-5


@pytest.fixture(scope="module")
def engine():
    return Engine(EngineConfig(model="tiny", page_size=4, device="cpu", seed=0))


def reference(engine: Engine, ids: list[int]) -> np.ndarray:
    """float64 log-softmax of the raw logits after ``ids`` (one fresh request, no cache)."""
    seen = []
    run = engine.runner.run

    def spy(batch):
        out = run(batch)
        seen.append(out.double())
        return out

    engine.runner.run = spy
    try:
        engine.generate_batch([ids], SamplingParams(max_tokens=1, temperature=0.0))
    finally:
        del engine.runner.run
    x = seen[-1][-1].numpy()
    return x - np.log(np.exp(x - x.max()).sum()) - x.max()


def check_entry(entry: TokenLogprob, ref: np.ndarray, token: int, k: int) -> None:
    assert abs(entry.logprob - ref[token]) < TOL
    assert len(entry.top_ids) == len(entry.top_logprobs) == k
    order = np.argsort(-ref, kind="stable")[:k]
    assert entry.top_ids == order.tolist()
    np.testing.assert_allclose(entry.top_logprobs, ref[order], atol=TOL)


def test_token_logprobs_batches_only_the_rows_that_ask():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1)) * 4
    out = token_logprobs(logits, [2, None, 0], [5, 7, 9])
    assert out[1] is None
    ref = torch.log_softmax(logits.double(), -1)
    assert abs(out[0].logprob - ref[0, 5].item()) < TOL
    assert out[0].top_ids == torch.topk(ref[0], 2).indices.tolist()
    assert out[2] == TokenLogprob(out[2].logprob) and abs(out[2].logprob - ref[2, 9]) < TOL
    assert token_logprobs(logits, [None] * 3, [0, 0, 0]) == [None] * 3


@pytest.mark.parametrize("chunk_rows", [1, 3, 64])
def test_token_logprobs_in_chunks_is_the_whole_pass(monkeypatch, chunk_rows):
    """Rows go through in pieces of CHUNK_BYTES: every row, all rows or a subset asking, with
    counts that differ per row, gets what one log-softmax over the whole batch gives."""
    from radixray.worker import logprobs

    logits = torch.randn(10, 50, generator=torch.Generator().manual_seed(2)) * 4
    monkeypatch.setattr(logprobs, "CHUNK_BYTES", chunk_rows * 50 * 4)
    ref = torch.log_softmax(logits.double(), -1)
    tokens = [(7 * i) % 50 for i in range(10)]
    for counts in ([3] * 10, [0] * 10, [None, 2, None, 0, 5, None, 1, 4, None, 3]):
        out = token_logprobs(logits, counts, tokens)
        for i, (k, entry) in enumerate(zip(counts, out, strict=True)):
            if k is None:
                assert entry is None
                continue
            assert abs(entry.logprob - ref[i, tokens[i]].item()) < TOL
            assert entry.top_ids == torch.topk(ref[i], k).indices.tolist()
            np.testing.assert_allclose(entry.top_logprobs, torch.topk(ref[i], k).values, atol=TOL)


@pytest.mark.parametrize("k", [0, 1, 5, 20])
def test_generated_logprobs_match_the_reference(engine, k):
    prompt = [5, 17, 3, 99, 42, 8, 21]
    params = SamplingParams(max_tokens=6, temperature=0.0, logprobs=k, ignore_eos=True)
    chunks: list[StreamChunk] = []
    engine.add_request(prompt, params, request_id=f"g{k}")
    while engine.has_work():
        chunks += engine.step()
    lps = [e for c in chunks for e in c.logprobs]
    out = [t for c in chunks for t in c.token_ids]
    assert len(lps) == len(out) == 6
    for i, (tok, entry) in enumerate(zip(out, lps, strict=True)):
        ref = reference(engine, prompt + out[:i])
        check_entry(entry, ref, tok, k)
        assert abs(entry.logprob - ref.max()) < TOL  # greedy: the most likely token


def test_logprobs_are_of_the_raw_logits_before_temperature_and_controls(engine):
    prompt = [1, 2, 3, 4, 5, 6]
    params = SamplingParams(
        max_tokens=3,
        temperature=0.7,
        top_k=3,
        seed=4,
        logprobs=2,
        presence_penalty=1.5,
        logit_bias=((7, 5.0),),
        ignore_eos=True,
    )
    c = engine.generate_batch([prompt], params)[0]
    chunks: list[StreamChunk] = []
    engine.add_request(prompt, params, request_id="raw")
    while engine.has_work():
        chunks += engine.step()
    out = [t for ch in chunks for t in ch.token_ids]
    assert out == c.token_ids
    for i, entry in enumerate(e for ch in chunks for e in ch.logprobs):
        check_entry(entry, reference(engine, prompt + out[:i]), out[i], 2)


def test_no_logprobs_unless_asked(engine):
    engine.add_request([3, 4, 5], SamplingParams(max_tokens=2), request_id="plain")
    chunks = []
    while engine.has_work():
        chunks += engine.step()
    assert all(c.logprobs is None and c.prompt_logprobs is None for c in chunks)


def _run(engine, prompt, params, rid):
    chunks: list[StreamChunk] = []
    engine.add_request(prompt, params, request_id=rid)
    while engine.has_work():
        chunks += engine.step()
    return chunks


def test_prompt_logprobs_match_the_reference_and_skip_the_cache(engine):
    # 14 tokens over pages of 4 and a token budget that splits the prefill into chunks.
    prompt = [9, 30, 31, 2, 77, 12, 14, 15, 60, 61, 62, 4, 5, 6]
    params = SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=3, logprobs=1)
    first = _run(engine, prompt, params, "p1")
    plp = first[0].prompt_logprobs
    assert plp[0] is None and len(plp) == len(prompt)
    assert all(c.prompt_logprobs is None for c in first[1:])
    for q in range(1, len(prompt)):
        check_entry(plp[q], reference(engine, prompt[:q]), prompt[q], 3)
    # Again: the pages are cached now, but a prompt-logprob request is computed whole.
    again = _run(engine, prompt, params, "p2")
    assert again[0].prompt_logprobs == plp
    assert again[-1].cached_tokens == 0
    # A plain request after it still reuses the pages it inserted.
    plain = _run(engine, prompt, SamplingParams(max_tokens=1), "p3")
    assert plain[-1].cached_tokens == 12
    engine.check_integrity()


def test_prompt_logprobs_with_chunked_prefill():
    eng = Engine(EngineConfig(model="tiny", page_size=4, device="cpu", seed=0, max_batch_tokens=5))
    prompt = list(range(3, 20))
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=2)
    chunks = _run(eng, prompt, params, "c")
    plp = chunks[0].prompt_logprobs
    assert len(plp) == len(prompt)
    for q in range(1, len(prompt)):
        check_entry(plp[q], reference(eng, prompt[:q]), prompt[q], 2)


@pytest.mark.parametrize("field", ["logprobs", "prompt_logprobs"])
@pytest.mark.parametrize("bad", [-1, 21, True, 1.5])
def test_bad_counts_are_refused(field, bad):
    with pytest.raises(InvalidRequest) as e:
        SamplingParams(**{field: bad})
    assert e.value.param == field
