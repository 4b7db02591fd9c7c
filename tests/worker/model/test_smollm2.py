"""The real model, SmolLM2-135M-Instruct from its Q4_1 GGUF, against HF transformers loading the
same file (``hf_reference.py``), and a greedy chat answer."""

import os

import pytest
import torch

from radixray.worker.model import AttentionMetadata, greedy_generate, new_kv_cache

from .hf_reference import PROMPTS, TOP_K, hf_reference, load_reference

pytestmark = pytest.mark.slow

# Both sides dequantise Q4_1 to the same float32 weights; what differs is summation order over 30
# layers (|logit| up to ~40). Measured: max abs difference 6.5e-5, max relative 1.2e-5.
RTOL, ATOL = 1e-4, 2e-4


def our_logits(loaded, ids: list[int]) -> torch.Tensor:
    """All positions' logits, the prompt split in two chunks over a non-contiguous page table."""
    page_size, n = 16, len(ids)
    pages = list(reversed(range(-(-n // page_size))))
    k, v = new_kv_cache(loaded.model, len(pages), page_size)
    split = n // 2 + 3
    out = []
    for start, end in ((0, split), (split, n)):
        attn, positions = AttentionMetadata.build([pages], [start], [end - start], page_size)
        rows = torch.arange(end - start)
        out.append(loaded.model(torch.tensor(ids[start:end]), positions, attn, k, v, rows))
    return torch.cat(out)


def check_against(reference: dict[str, torch.Tensor], loaded) -> None:
    for i, prompt in enumerate(PROMPTS):
        ids = reference[f"{i}.ids"].tolist()
        chat = [{"role": "user", "content": prompt}]
        assert loaded.tokenizer.encode(loaded.tokenizer.apply_chat_template(chat)) == ids
        logits = our_logits(loaded, ids)
        top_ids = reference[f"{i}.top_ids"]
        assert top_ids.shape == (len(ids), TOP_K)
        torch.testing.assert_close(
            logits.gather(1, top_ids), reference[f"{i}.top_logits"], rtol=RTOL, atol=ATOL
        )
        torch.testing.assert_close(
            logits.logsumexp(-1), reference[f"{i}.logsumexp"], rtol=RTOL, atol=ATOL
        )
        assert torch.equal(logits.argmax(-1), top_ids[:, 0]), f"greedy token differs: {prompt}"


def test_config_from_gguf_metadata(smollm2):
    c = smollm2.config
    assert (c.num_layers, c.hidden_size, c.intermediate_size) == (30, 576, 1536)
    assert (c.num_heads, c.num_kv_heads, c.head_dim) == (9, 3, 64)
    assert c.rope_theta == 100000.0 and c.tie_word_embeddings and c.vocab_size == 49152
    assert (c.bos_token_id, c.eos_token_id) == (1, 2)


def test_logits_match_transformers(smollm2):
    check_against(load_reference(), smollm2)


@pytest.mark.skipif(
    os.environ.get("RADIXRAY_HF_LIVE") != "1",
    reason="recomputing the HF reference takes ~1 min; set RADIXRAY_HF_LIVE=1 (needs accelerate)",
)
def test_logits_match_transformers_live(smollm2):
    check_against(hf_reference(), smollm2)


def test_greedy_chat_answer_contains_paris(smollm2):
    tok = smollm2.tokenizer
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tok.encode(tok.apply_chat_template(chat))
    out = greedy_generate(smollm2.model, ids, 12, tok.stop_token_ids)
    assert "Paris" in tok.decode(out)
