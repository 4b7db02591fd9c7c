"""Every architecture of the decoder family against HF transformers: a small random-weight model
built here, written with ``save_pretrained`` and loaded by ``EngineConfig(model=<dir>)``.

- float32 logits within 1e-4 of transformers' over a paged run (prefill chunk, then decodes);
- greedy tokens equal to transformers' greedy choice through the Engine for 200 steps, and again
  from the prefix cache (the prompt plus the first half of the output, cached, continues to the
  same second half).
"""

from __future__ import annotations

import pytest
import torch

from radixray.worker import Engine, EngineConfig, SamplingParams
from radixray.worker.model import AttentionMetadata, load_model, new_kv_cache

VS_HF = {"rtol": 1e-4, "atol": 1e-4}
STEPS = 200
COMMON = {
    "vocab_size": 300,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "attn_implementation": "eager",
}
# Gemma 3 (one local layer, one global), its RoPE as transformers 5 writes it: the global layer
# with linear scaling, a softmax scale that is not head_dim's, final logits soft-capped.
GEMMA3_TEXT = {
    "sliding_window": 16,
    "layer_types": ["sliding_attention", "full_attention"],
    "query_pre_attn_scalar": 24,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 2.0},
    },
    "final_logit_softcapping": 30.0,
    "tie_word_embeddings": True,
}
# A vision tower as small as it gets: the text worker must ignore its weights.
SIGLIP = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "image_size": 28,
    "patch_size": 14,
}
# family -> (transformers classes, config fields beyond COMMON)
FAMILIES = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "norm_topk_prob": True,
            "mlp_only_layers": [1],  # one MoE layer, one dense: both kinds are tested
        },
    ),
    "qwen3_moe_unnormalised": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {"num_experts": 6, "num_experts_per_tok": 3, "moe_intermediate_size": 24},
    ),
    # windows far shorter than the 221 tokens of a greedy run: the window layers are exercised
    "mistral_window": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 16}),
    "qwen2_window": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1},
    ),
    # Llama 3.1's RoPE scaling: with head_dim 16 and this context, one frequency is kept, one
    # interpolated, six divided by the factor
    "llama31": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        },
    ),
    "llama_linear": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}},
    ),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", GEMMA3_TEXT),
    # Gemma 2: every other layer local, attention scores soft-capped (a cap they reach here)
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {
            "sliding_window": 16,
            "query_pre_attn_scalar": 24,
            "attn_logit_softcapping": 5.0,
            "final_logit_softcapping": 30.0,
            "tie_word_embeddings": True,
        },
    ),
    "gemma3": ("Gemma3Config", "Gemma3ForConditionalGeneration", GEMMA3_TEXT),
}


def spread_weights(hf, seed: int = 0) -> None:
    """Replace transformers' init (std 0.02: logits near zero, greedy decided by rounding) with
    weights that keep activations O(1) and spread the logits (std ~3), norms and biases random."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "norm" in name:
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith("bias"):
                p.copy_(0.3 * noise)
            elif "lm_head" in name:
                p.copy_(noise * 3.0 / p.shape[-1] ** 0.5)
            elif "embed_tokens" in name:
                p.copy_(noise)
            else:
                p.copy_(noise * p.shape[-1] ** -0.5)


def hf_checkpoint(family: str, path, eos=None):
    """A random transformers model of ``family`` written to ``path``; returns the model."""
    import transformers

    config_cls, model_cls, extra = FAMILIES[family]
    fields = COMMON | extra | {"eos_token_id": eos}
    if family == "gemma3":  # the text model nested, beside a vision tower
        text = transformers.Gemma3TextConfig(**fields)
        config = transformers.Gemma3Config(
            text_config=text.to_dict(),
            vision_config=SIGLIP,
            mm_tokens_per_image=4,
            eos_token_id=eos,
            tie_word_embeddings=True,
        )
    else:
        config = getattr(transformers, config_cls)(**fields)
    torch.manual_seed(0)
    hf = getattr(transformers, model_cls)(config).eval()
    spread_weights(hf)
    hf.save_pretrained(path)
    return hf


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """family -> (family, directory, transformers model), each written once for the module."""
    made: dict[str, tuple] = {}

    def get(family: str) -> tuple:
        if family not in made:
            path = tmp_path_factory.mktemp(family)
            made[family] = (family, path, hf_checkpoint(family, path))
        return made[family]

    return get


# The greedy runs of variants whose layers the fast tier already covers run with the
# integration tests (each is 1-3 s on a busy 2-core machine).
VARIANTS = ("mistral", "qwen3_moe_unnormalised", "qwen2_window", "gemma3", "llama_linear")
GREEDY_FAMILIES = [
    pytest.param(f, marks=[pytest.mark.integration, pytest.mark.parallel_safe])
    if f in VARIANTS
    else f
    for f in FAMILIES
]


def paged_logits(model, tokens: list[int], first_chunk: int) -> torch.Tensor:
    """Logits of every position: a prefill chunk, then one token per step, on shuffled pages."""
    page_size, pages = 4, list(reversed(range(-(-len(tokens) // 4))))
    k, v = new_kv_cache(model, len(pages), page_size)
    out, done = [], 0
    for n in [first_chunk] + [1] * (len(tokens) - first_chunk):
        attn, positions = AttentionMetadata.build([pages], [done], [n], page_size)
        ids = torch.tensor(tokens[done : done + n])
        out.append(model(ids, positions, attn, k, v, torch.arange(n)))
        done += n
    return torch.cat(out)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_match_transformers(checkpoints, family):
    family, path, hf = checkpoints(family)
    model, config, _ = load_model(str(path))
    assert config.architecture == hf.config.model_type
    tokens = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.inference_mode():
        expected = hf(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(paged_logits(model, tokens, 25), expected, **VS_HF)
    # the weights come back out exactly as the checkpoint holds them, under the same names
    from safetensors.torch import load_file

    saved = load_file(str(path / "model.safetensors"))
    if family == "gemma3":
        saved = text_weights(saved)
    exported = model.hf_state_dict()
    assert exported.keys() == saved.keys()
    assert all(torch.equal(exported[k], saved[k]) for k in saved)


def text_weights(saved: dict) -> dict:
    """A Gemma3ForConditionalGeneration file's text weights, under Gemma3ForCausalLM's names
    (transformers 5 writes them as 4.x did: ``language_model.model.*``, ``vision_tower.*``)."""
    prefix = "language_model.model."
    assert any(k.startswith("vision_tower.") for k in saved)  # there, and to be ignored
    return {"model." + k[len(prefix) :]: v for k, v in saved.items() if k.startswith(prefix)}


def hf_greedy(hf, prompt: list[int], tokens: list[int]) -> list[int]:
    """transformers' greedy token after ``prompt + tokens[:i]`` for every i: where ``tokens``
    first differs from it, it differs from transformers' greedy run."""
    with torch.inference_mode():
        logits = hf(torch.tensor([prompt + tokens])).logits[0]
    return logits[len(prompt) - 1 : -1].argmax(-1).tolist()


@pytest.mark.parametrize("family", GREEDY_FAMILIES)
def test_greedy_tokens_match_transformers_through_the_engine(checkpoints, family):
    family, path, hf = checkpoints(family)
    prompt = torch.randint(0, 300, (21,), generator=torch.Generator().manual_seed(2)).tolist()
    engine = Engine(EngineConfig(model=str(path), page_size=4, device="cpu", num_pages=256))
    greedy = SamplingParams(max_tokens=STEPS, temperature=0.0, ignore_eos=True)
    first = engine.generate_batch([prompt], greedy)[0]
    assert len(first.token_ids) == STEPS
    # transformers' greedy choice at every step, given the tokens before it: its argmax over one
    # forward of the whole sequence (what ``generate(do_sample=False)`` picks one step at a
    # time, in one forward instead of 200: ~1 s less a family)
    ref = hf_greedy(hf, prompt, first.token_ids)
    assert first.token_ids == ref
    half = STEPS // 2
    rest = SamplingParams(max_tokens=STEPS - half, temperature=0.0, ignore_eos=True)
    again = engine.generate_batch([prompt + ref[:half]], rest)[0]
    # the cached path: every whole page (of 4) of the new prompt but its last token's; with
    # window layers (swa_radix) the pages are cached but the first run dropped their window
    # pages as it went on: a "window" miss, recomputed
    present = again.cached_tokens + again.miss["window"]
    assert present == (len(prompt) + half - 1) // 4 * 4
    assert again.token_ids == ref[half:]
    engine.check_integrity()
