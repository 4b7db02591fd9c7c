"""``load_model(spec)``: the one entry point from a model name or path to a ready model.

Valid specs: see ``radixray.model_meta`` (the same resolution, metadata only, torch-free).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

import torch

from radixray.model_meta import (
    ByteTokenizer,
    ModelConfig,
    TokenizerProtocol,
    open_checkpoint,
    smollm2_gguf_path,
    tiny_config,
)

from .gguf_file import GGUFCheckpoint
from .hf_checkpoint import HFCheckpoint
from .linear import pack_linears
from .llama import LlamaModel

__all__ = ["LoadedModel", "load_model", "random_hf_state_dict", "smollm2_gguf_path"]


class LoadedModel(NamedTuple):
    model: LlamaModel
    config: ModelConfig
    tokenizer: TokenizerProtocol | None


def random_hf_state_dict(
    config: ModelConfig, seed: int = 0, device: str = "cpu", dtype=torch.float32
) -> dict[str, torch.Tensor]:
    """Seeded random weights under HF names: by default float32 from a CPU generator, the same
    on every machine; with ``device`` (and ``dtype``) made there, from that device's generator
    (an 8B model's 16 GB in seconds on a GPU: benchmarks/gpu/big_check.py).

    Scales keep activations O(1) through the layers and spread the logits (std ~3), so greedy
    argmax has clear winners and exactness tests are not decided by float rounding.
    """
    g = torch.Generator(device=device).manual_seed(seed)
    H, V, I = config.hidden_size, config.vocab_size, config.intermediate_size  # noqa: E741

    def normal(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=device, dtype=dtype) * std

    def norm_weight() -> torch.Tensor:
        return 1.0 + normal(H, std=0.1)

    state = {
        "model.embed_tokens.weight": normal(V, H, std=3.0 / math.sqrt(H)),
        "model.norm.weight": norm_weight(),
    }
    if not config.tie_word_embeddings:
        state["lm_head.weight"] = normal(V, H, std=3.0 / math.sqrt(H))
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        state[p + "input_layernorm.weight"] = norm_weight()
        state[p + "post_attention_layernorm.weight"] = norm_weight()
        state[p + "self_attn.q_proj.weight"] = normal(config.q_size, H, std=H**-0.5)
        state[p + "self_attn.k_proj.weight"] = normal(config.kv_size, H, std=H**-0.5)
        state[p + "self_attn.v_proj.weight"] = normal(config.kv_size, H, std=H**-0.5)
        state[p + "self_attn.o_proj.weight"] = normal(H, config.q_size, std=config.q_size**-0.5)
        state[p + "mlp.gate_proj.weight"] = normal(I, H, std=H**-0.5)
        state[p + "mlp.up_proj.weight"] = normal(I, H, std=H**-0.5)
        state[p + "mlp.down_proj.weight"] = normal(H, I, std=I**-0.5)
        if config.qk_norm:
            D = config.head_dim
            state[p + "self_attn.q_norm.weight"] = 1.0 + normal(D, std=0.1)
            state[p + "self_attn.k_norm.weight"] = 1.0 + normal(D, std=0.1)
    return state


def _build(config: ModelConfig, state, device, dtype) -> LlamaModel:
    model = LlamaModel(config, device=device, dtype=dtype)
    model.load_hf_state_dict(state)
    pack_linears(model)  # CPU float32: oneDNN-packed weights (see linear.py); else a no-op
    return model.eval()


def load_model(
    spec: str | Path = "smollm2",
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> LoadedModel:
    """Load ``spec`` (see the module docstring) -> ``(model, config, tokenizer_or_None)``.

    ``seed`` only matters for "tiny". ``tokenizer`` is None for an HF directory without
    ``tokenizer.json``. Raises ValueError for a spec that is none of the valid forms.
    """
    if isinstance(spec, str) and spec == "tiny":
        config = tiny_config()
        return LoadedModel(
            _build(config, random_hf_state_dict(config, seed), device, dtype),
            config,
            ByteTokenizer(),
        )
    ckpt = open_checkpoint(spec, GGUFCheckpoint, HFCheckpoint)
    config = ckpt.config()
    model = _build(config, ckpt.hf_state_dict(config), device, dtype)
    return LoadedModel(model, config, ckpt.tokenizer())
