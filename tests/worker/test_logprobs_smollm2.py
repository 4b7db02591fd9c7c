"""Logprobs of the real model (SmolLM2-135M-Instruct) against HF transformers' logits of the
same GGUF (the stored reference of tests/worker/model/hf_reference.py: per position HF's top-64
logits and the row's logsumexp), prompt logprobs (echo) and the first sampled token's; then
the decode steps' along HF's greedy continuation (tests/worker/hf_decode_reference.py)."""

from __future__ import annotations

import os

import pytest
import torch

from radixray.worker import Engine, EngineConfig, SamplingParams

from .hf_decode_reference import STEPS, hf_decode_reference, load_decode_reference
from .model.hf_reference import PROMPTS, load_reference

pytestmark = pytest.mark.slow

# HF's logits and ours differ by up to ~2e-4 (test_smollm2.py); a logprob adds the logsumexp's.
ATOL = 5e-4
K = 5


def test_prompt_and_token_logprobs_match_transformers(smollm2_loaded):
    cfg = EngineConfig(model="smollm2", page_size=16, num_pages=64, max_batch_tokens=17)
    e = Engine(cfg, loaded=smollm2_loaded)
    ref = load_reference()
    for i in range(len(PROMPTS)):
        ids = ref[f"{i}.ids"].tolist()
        hf = ref[f"{i}.top_logits"] - ref[f"{i}.logsumexp"][:, None]  # [n, 64] logprobs
        hf_ids = ref[f"{i}.top_ids"]
        params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=K, prompt_logprobs=K)
        e.add_request(ids, params, request_id=f"r{i}")
        chunks = []
        while e.has_work():
            chunks += e.step()
        (chunk,) = chunks
        plp = chunk.prompt_logprobs
        assert plp[0] is None and len(plp) == len(ids)
        # the logits at position p: prompt token p + 1's entry, or the sampled token's at the end
        entries = [*plp[1:], chunk.logprobs[0]]
        for p, entry in enumerate(entries):
            at = dict(zip(hf_ids[p].tolist(), hf[p].tolist(), strict=True))
            torch.testing.assert_close(
                torch.tensor(entry.top_logprobs), hf[p, :K], atol=ATOL, rtol=0
            )
            for t, v in zip(entry.top_ids, entry.top_logprobs, strict=True):
                assert abs(at[t] - v) < ATOL
            token = ids[p + 1] if p + 1 < len(ids) else chunk.token_ids[0]
            if token in at:
                assert abs(at[token] - entry.logprob) < ATOL
        # greedy: the sampled token is HF's most likely, its logprob the top one
        assert chunk.token_ids[0] == hf_ids[-1, 0].item()
        assert abs(chunk.logprobs[0].logprob - hf[-1, 0].item()) < ATOL


@pytest.mark.integration  # ~10 s
@pytest.mark.parallel_safe
def test_decode_logprobs_match_transformers(smollm2_loaded):
    check_decode(load_decode_reference(), smollm2_loaded)


@pytest.mark.integration
@pytest.mark.parallel_safe
@pytest.mark.skipif(
    os.environ.get("RADIXRAY_HF_LIVE") != "1",
    reason="recomputing the HF reference takes ~1 min; set RADIXRAY_HF_LIVE=1 (needs accelerate)",
)
def test_decode_logprobs_match_transformers_live(smollm2_loaded):
    check_decode(hf_decode_reference(), smollm2_loaded)


def check_decode(ref: dict[str, torch.Tensor], loaded) -> None:
    """The logprobs of decode steps (logits from the paged KV cache, the three prompts decoded
    in one batch) against HF's full forward over the same tokens (hf_decode_reference.py): the
    greedy tokens are HF's, each logprob and top-5 within ATOL."""
    e = Engine(EngineConfig(model="smollm2", page_size=16, num_pages=64), loaded=loaded)
    params = SamplingParams(max_tokens=STEPS, temperature=0.0, logprobs=K, ignore_eos=True)
    # one sink per request (chunks carry no request id), all three run together
    reqs = [e.requests.build(ref[f"{i}.ids"].tolist(), params, None, None) for i in range(3)]
    chunks: list[list] = [[] for _ in reqs]
    e.loop.run(zip(reqs, [c.append for c in chunks], strict=True))
    out = {
        f"d{i}": [(t, lp) for c in cs for t, lp in zip(c.token_ids, c.logprobs, strict=True)]
        for i, cs in enumerate(chunks)
    }
    assert len(PROMPTS) == 3
    for i in range(len(PROMPTS)):
        hf = ref[f"{i}.top_logits"] - ref[f"{i}.logsumexp"][:, None]  # [STEPS, 64] logprobs
        hf_ids = ref[f"{i}.top_ids"]
        assert [t for t, _ in out[f"d{i}"]] == ref[f"{i}.generated"].tolist()
        for p, (_, entry) in enumerate(out[f"d{i}"]):
            at = dict(zip(hf_ids[p].tolist(), hf[p].tolist(), strict=True))
            assert abs(entry.logprob - hf[p, 0].item()) < ATOL  # greedy: HF's most likely
            torch.testing.assert_close(
                torch.tensor(entry.top_logprobs), hf[p, :K], atol=ATOL, rtol=0
            )
            for t, v in zip(entry.top_ids, entry.top_logprobs, strict=True):
                assert abs(at[t] - v) < ATOL
