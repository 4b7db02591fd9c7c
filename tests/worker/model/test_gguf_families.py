"""GGUF files (general.architecture qwen2, qwen3, qwen3moe, and llama with Llama 3.1's RoPE
scaling in rope_freqs) written here the way llama.cpp's converter writes them, from a random
transformers checkpoint: the loader must give back the same weights and the same logits as the
HF directory, and the tokenizer must split as Qwen's does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixray.model_meta import UnsupportedModelError, load_model_meta
from radixray.worker.model import load_model

from .test_loader import llama_cpp_permute
from .test_model_families import hf_checkpoint, paged_logits

# HF family (test_model_families.FAMILIES) -> GGUF general.architecture
GGUF_ARCH = {"qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3moe", "llama31": "llama"}
_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    **{f"self_attn.{n}_proj.weight": f"attn_{n}.weight" for n in "qkv"},
    **{f"self_attn.{n}_proj.bias": f"attn_{n}.bias" for n in "qkv"},
    **{f"self_attn.{n}_norm.weight": f"attn_{n}_norm.weight" for n in "qk"},
}
_TOP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def gguf_tensors(state: dict[str, torch.Tensor], config, arch: str) -> dict[str, np.ndarray]:
    """HF names -> llama.cpp's, per-expert weights stacked into one [E, out, in] tensor each;
    for ``llama`` q/k rows permuted and RoPE's frequency divisors in ``rope_freqs``, as
    llama.cpp's converter writes them."""
    out = {_TOP[k]: v for k, v in state.items() if k in _TOP}
    if arch == "llama":
        state = dict(state)
        for name, w in state.items():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                heads = config.num_heads if "q_proj" in name else config.num_kv_heads
                state[name] = llama_cpp_permute(w, heads)
        if config.rope_freq_factors:
            out["rope_freqs.weight"] = torch.tensor(config.rope_freq_factors)
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        for hf_name, gguf_name in _LAYER.items():
            if p + hf_name in state:
                out[f"blk.{i}.{gguf_name}"] = state[p + hf_name]
        if config.is_moe_layer(i):
            for proj in ("gate", "up", "down"):
                experts = [
                    state[p + f"mlp.experts.{e}.{proj}_proj.weight"]
                    for e in range(config.num_experts)
                ]
                out[f"blk.{i}.ffn_{proj}_exps.weight"] = torch.stack(experts)
    return {k: np.ascontiguousarray(v.numpy()) for k, v in out.items()}


def write_gguf(path, arch: str, config, state, tokenizer_model: str = "gpt2") -> None:
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(config.num_layers)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_heads)
    w.add_head_count_kv(config.num_kv_heads)
    w.add_key_length(config.head_dim)
    w.add_value_length(config.head_dim)
    w.add_rope_freq_base(config.rope_theta)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    if config.num_experts:
        w.add_expert_count(config.num_experts)
        w.add_expert_used_count(config.num_experts_per_tok)
        w.add_expert_feed_forward_length(config.moe_intermediate_size)
    w.add_tokenizer_model(tokenizer_model)
    w.add_tokenizer_pre("qwen2")
    alphabet = [chr(c) for c in range(33, 127)] + ["Ġ"]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = alphabet + ["Ġt", "he"] + specials
    tokens += [f"<|x{i}|>" for i in range(config.vocab_size - len(tokens))]
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(alphabet) + 2) + [3] * (config.vocab_size - len(alphabet) - 2))
    w.add_token_merges(["Ġ t", "h e"])
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    w.add_rope_dimension_count(config.head_dim)
    for name, tensor in gguf_tensors(state, config, arch).items():
        w.add_tensor(name, tensor)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("family", list(GGUF_ARCH))
def test_gguf_loads_to_the_same_model_as_the_hf_directory(tmp_path, family):
    hf_dir = tmp_path / "hf"
    hf_checkpoint(family, hf_dir)
    reference, config, _ = load_model(str(hf_dir))
    path = tmp_path / f"{family}.gguf"
    write_gguf(path, GGUF_ARCH[family], config, reference.hf_state_dict())

    model, loaded, tokenizer = load_model(str(path))
    assert loaded.architecture == config.architecture == family.removesuffix("31")
    flags = ("qkv_bias", "qk_norm", "num_experts", "num_experts_per_tok", "dense_layers")
    for flag in flags:
        assert getattr(loaded, flag) == getattr(config, flag), flag
    # rope_freqs holds the divisors in float32: equal to that precision, and so the logits
    assert loaded.rope_freq_factors == pytest.approx(config.rope_freq_factors, rel=1e-7)
    exact = {"rtol": 0, "atol": 0} if not config.rope_freq_factors else {"rtol": 0, "atol": 1e-5}
    expected = reference.hf_state_dict()
    got = model.hf_state_dict()
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    tokens = list(range(5, 45))
    torch.testing.assert_close(
        paged_logits(model, tokens, 30), paged_logits(reference, tokens, 30), **exact
    )
    ends = {tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>")}
    assert set(tokenizer.stop_token_ids) == ends and loaded.eos_token_id in ends


def test_qwen_gguf_tokenizer_splits_digits_one_by_one(tmp_path):
    hf_dir = tmp_path / "hf"
    hf_checkpoint("qwen2", hf_dir)
    reference, config, _ = load_model(str(hf_dir))
    write_gguf(tmp_path / "q.gguf", "qwen2", config, reference.hf_state_dict())
    tok = load_model_meta(str(tmp_path / "q.gguf")).tokenizer
    ids = tok.encode("the 2025")
    assert [tok.decode([i]) for i in ids] == ["t", "he", " ", "2", "0", "2", "5"]
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.encode(prompt)[0] == tok.token_to_id("<|im_start|>")


def test_gguf_files_the_worker_cannot_run_are_refused_with_the_reason(tmp_path):
    hf_dir = tmp_path / "hf"
    hf_checkpoint("qwen2", hf_dir)
    reference, config, _ = load_model(str(hf_dir))
    state = reference.hf_state_dict()
    write_gguf(tmp_path / "sp.gguf", "qwen2", config, state, tokenizer_model="llama")
    with pytest.raises(UnsupportedModelError, match="not SentencePiece"):
        load_model(str(tmp_path / "sp.gguf"))
    write_gguf(tmp_path / "g.gguf", "gemma3", config, state)
    with pytest.raises(UnsupportedModelError, match="'gemma3' is not supported; supported: llama"):
        load_model(str(tmp_path / "g.gguf"))
