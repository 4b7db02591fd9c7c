"""Loaders: a spec that is none of the valid forms, an HF safetensors directory against
transformers, and a GGUF file written from known weights (llama.cpp's q/k permutation applied, as
its converter does) that must load back to the same model."""

import numpy as np
import pytest
import torch

from radixray.worker.model import AttentionMetadata, load_model, new_kv_cache, tiny_config
from radixray.worker.model.gguf_file import unpermute_qk
from radixray.worker.model.loader import random_hf_state_dict


def llama_cpp_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """What llama.cpp's HF -> GGUF converter does to q/k rows (interleave the rotate-half pairs)."""
    rows, dim = w.shape
    return w.reshape(n_head, 2, rows // n_head // 2, dim).transpose(1, 2).reshape(rows, dim)


def logits_of(model, tokens: list[int]) -> torch.Tensor:
    attn, positions = AttentionMetadata.build([[3, 1, 2, 0]], [0], [len(tokens)], 8)
    k, v = new_kv_cache(model, 4, 8)
    return model(torch.tensor(tokens), positions, attn, k, v, torch.arange(len(tokens)))


def test_wrong_spec_lists_the_valid_forms(tmp_path):
    for spec in ("smollm3", str(tmp_path / "missing.gguf"), str(tmp_path)):
        with pytest.raises(
            ValueError, match="'smollm2'.*'tiny'.*gguf.*HF directory.*llama, mistral, qwen2"
        ):
            load_model(spec)


def test_unpermute_inverts_llama_cpp_permutation():
    w = torch.randn(3 * 64, 40)
    assert torch.equal(unpermute_qk(llama_cpp_permute(w, 3), 3), w)
    assert not torch.equal(llama_cpp_permute(w, 3), w)


def test_hf_safetensors_directory_matches_transformers(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    hf = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=300,
            hidden_size=48,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=2,
            rope_theta=50000.0,
            rms_norm_eps=1e-6,
            max_position_embeddings=256,
            tie_word_embeddings=False,
            bos_token_id=1,
            eos_token_id=[2, 3],
            attn_implementation="eager",
        )
    ).eval()
    with torch.no_grad():  # HF initialises norms to 1: randomise them so they are tested too
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    hf.save_pretrained(tmp_path)

    model, config, tokenizer = load_model(str(tmp_path))
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (6, 2, 8)
    assert config.rope_theta == 50000.0 and config.eos_token_id == 2
    assert not config.tie_word_embeddings and tokenizer is None
    tokens = torch.randint(0, 300, (21,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.inference_mode():
        expected = hf(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(logits_of(model, tokens), expected, rtol=1e-4, atol=1e-4)


def test_gguf_file_loads_back_to_the_same_model(tmp_path):
    """Write known float32 weights the way llama.cpp does; the loader must give them back
    (un-permuted) and the model must compute the same logits, bit for bit."""
    import gguf

    config = tiny_config()
    state = random_hf_state_dict(config, seed=5)
    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(config.num_layers)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_heads)
    w.add_head_count_kv(config.num_kv_heads)
    w.add_rope_dimension_count(config.head_dim)
    w.add_rope_freq_base(config.rope_theta)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    alphabet = [chr(c) for c in range(33, 127)] + ["Ġ"]  # enough for ASCII text
    tokens = alphabet + ["Ġt", "he"] + [f"<|x{i}|>" for i in range(320 - len(alphabet) - 2)]
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(alphabet) + 2) + [3] * (320 - len(alphabet) - 2))
    w.add_token_merges(["Ġ t", "h e"])
    w.add_bos_token_id(config.bos_token_id)
    w.add_eos_token_id(config.eos_token_id)
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    layer = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for i in range(config.num_layers):
        for hf_name, gguf_name in layer.items():
            names[f"model.layers.{i}.{hf_name}.weight"] = f"blk.{i}.{gguf_name}.weight"
    for hf_name, tensor in state.items():
        if hf_name.endswith("q_proj.weight"):
            tensor = llama_cpp_permute(tensor, config.num_heads)
        elif hf_name.endswith("k_proj.weight"):
            tensor = llama_cpp_permute(tensor, config.num_kv_heads)
        w.add_tensor(names[hf_name], np.ascontiguousarray(tensor.numpy()))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    model, loaded_config, tokenizer = load_model(str(path))
    assert loaded_config.num_layers == config.num_layers
    assert loaded_config.num_kv_heads == config.num_kv_heads
    assert not loaded_config.tie_word_embeddings
    reference = load_model("tiny", seed=5).model
    for name, tensor in model.hf_state_dict().items():
        assert torch.equal(tensor, reference.hf_state_dict()[name]), name
    ids = [5, 17, 40, 2, 99, 3]
    torch.testing.assert_close(logits_of(model, ids), logits_of(reference, ids), rtol=0, atol=0)
    pieces = ["t", "he", "Ġt", "e", "a"]  # "the" + "Ġtea", with the two merges applied
    assert tokenizer.encode("the tea") == [tokens.index(p) for p in pieces]
    assert tokenizer.decode(tokenizer.encode("the tea")) == "the tea"
