"""The decoder family's weights under HF transformers' names, in and out.

In: :func:`load_hf_weights` takes a state dict as ``*ForCausalLM`` checkpoints name it
(``model.layers.0.self_attn.q_proj.weight``, ...; rotate-half q/k layout) and fuses q/k/v and
gate/up into one matmul each. Out: :func:`export_hf_weights` gives them back unfused. What a
layer holds follows the config's flags: q/k/v biases (``qkv_bias``), ``q_norm``/``k_norm``
(``qk_norm``), and in MoE layers ``mlp.gate`` (the router) with ``mlp.experts.{e}.*`` per expert
(transformers 5's fused ``mlp.experts.gate_up_proj`` / ``down_proj`` are accepted too).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from radixray.model_meta.model_config import ModelConfig

__all__ = ["export_hf_weights", "hf_names", "load_hf_weights"]


def _mlp_names(prefix: str) -> list[str]:
    return [prefix + f"{n}_proj.weight" for n in ("gate", "up", "down")]


def _norm_names(cfg: ModelConfig) -> list[str]:
    """A layer's norms (not q/k's), named as in HF: Gemma's sandwich adds two."""
    names = ["input_layernorm", "post_attention_layernorm"]
    if cfg.sandwich_norms:
        names += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    return names


def hf_names(cfg: ModelConfig) -> list[str]:
    """Every weight a checkpoint of ``cfg`` must hold, under HF names."""
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not cfg.tie_word_embeddings:
        names.append("lm_head.weight")
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        names += [p + f"{n}.weight" for n in _norm_names(cfg)]
        names += [p + f"self_attn.{n}_proj.weight" for n in "qkvo"]
        if cfg.qkv_bias:
            names += [p + f"self_attn.{n}_proj.bias" for n in "qkv"]
        if cfg.qk_norm:
            names += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
        if cfg.is_moe_layer(i):
            names.append(p + "mlp.gate.weight")
            for e in range(cfg.num_experts):
                names += _mlp_names(p + f"mlp.experts.{e}.")
        else:
            names += _mlp_names(p + "mlp.")
    return names


def _unfuse_experts(state: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict:
    """transformers 5 keeps a layer's experts as ``mlp.experts.gate_up_proj [E, 2I, H]`` and
    ``mlp.experts.down_proj [E, H, I]``: split them into the per-expert names checkpoints use."""
    out = dict(state)
    I = cfg.moe_intermediate_size  # noqa: E741
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}.mlp.experts."
        if p + "gate_up_proj" not in out:
            continue
        gate_up, down = out.pop(p + "gate_up_proj"), out.pop(p + "down_proj")
        for e in range(gate_up.shape[0]):
            out[p + f"{e}.gate_proj.weight"] = gate_up[e, :I]
            out[p + f"{e}.up_proj.weight"] = gate_up[e, I:]
            out[p + f"{e}.down_proj.weight"] = down[e]
    return out


def load_hf_weights(model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy ``state`` into ``model`` (a ``LlamaModel``) on its device and dtype; every weight
    :func:`hf_names` lists must be present, with its shape."""
    cfg: ModelConfig = model.config
    if cfg.num_experts:
        state = _unfuse_experts(state, cfg)
    missing = [k for k in hf_names(cfg) if k not in state]
    if missing:
        raise KeyError(f"state dict lacks {len(missing)} weights, e.g. {missing[:4]}")

    def get(name: str, *shape: int) -> torch.Tensor:
        w = state[name]
        if tuple(w.shape) != shape:
            raise ValueError(f"{name}: expected shape {shape}, got {tuple(w.shape)}")
        return w.to(model.device, model.dtype)

    def param(*parts: torch.Tensor) -> nn.Parameter:
        t = parts[0] if len(parts) == 1 else torch.cat(parts)
        return nn.Parameter(t.contiguous(), requires_grad=False)

    def load_mlp(mlp: nn.Module, p: str, inter: int) -> None:
        gate, up = get(p + "gate_proj.weight", inter, H), get(p + "up_proj.weight", inter, H)
        mlp.gate_up_proj.weight = param(gate, up)
        mlp.down_proj.weight = param(get(p + "down_proj.weight", H, inter))

    H, V, D = cfg.hidden_size, cfg.vocab_size, cfg.head_dim
    Q, KV = cfg.q_size, cfg.kv_size
    model.embed_tokens.weight = param(get("model.embed_tokens.weight", V, H))
    model.norm.weight = param(get("model.norm.weight", H))
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    else:
        model.lm_head.weight = param(get("lm_head.weight", V, H))
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        for n in _norm_names(cfg):
            getattr(layer, n).weight = param(get(p + f"{n}.weight", H))
        a, attn = p + "self_attn.", layer.self_attn
        sizes = {"q": Q, "k": KV, "v": KV}
        attn.qkv_proj.weight = param(*(get(a + f"{n}_proj.weight", s, H) for n, s in sizes.items()))
        if cfg.qkv_bias:
            attn.qkv_proj.bias = param(*(get(a + f"{n}_proj.bias", s) for n, s in sizes.items()))
        if cfg.qk_norm:
            attn.q_norm.weight = param(get(a + "q_norm.weight", D))
            attn.k_norm.weight = param(get(a + "k_norm.weight", D))
        attn.o_proj.weight = param(get(a + "o_proj.weight", H, Q))
        if cfg.is_moe_layer(i):
            layer.mlp.gate.weight = param(get(p + "mlp.gate.weight", cfg.num_experts, H))
            for e, expert in enumerate(layer.mlp.experts):
                load_mlp(expert, p + f"mlp.experts.{e}.", cfg.moe_intermediate_size)
        else:
            load_mlp(layer.mlp, p + "mlp.", cfg.intermediate_size)


def export_hf_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The weights under HF names (unfused; views of the model's weights, or exact copies where
    a linear is packed), e.g. to build an independent transformers reference from them."""
    cfg: ModelConfig = model.config
    out = {
        "model.embed_tokens.weight": model.embed_tokens.weight,
        "model.norm.weight": model.norm.weight,
    }
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = model.lm_head.dense_weight()

    def put_mlp(mlp: nn.Module, p: str) -> None:
        gate, up = mlp.gate_up_proj.dense_weight().split(mlp.intermediate_size)
        out[p + "gate_proj.weight"], out[p + "up_proj.weight"] = gate, up
        out[p + "down_proj.weight"] = mlp.down_proj.dense_weight()

    split = [cfg.q_size, cfg.kv_size, cfg.kv_size]
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        for n in _norm_names(cfg):
            out[p + f"{n}.weight"] = getattr(layer, n).weight
        a, attn = p + "self_attn.", layer.self_attn
        for n, w in zip("qkv", attn.qkv_proj.dense_weight().split(split), strict=True):
            out[a + f"{n}_proj.weight"] = w
        if attn.qkv_proj.bias is not None:
            for n, b in zip("qkv", attn.qkv_proj.bias.split(split), strict=True):
                out[a + f"{n}_proj.bias"] = b
        if cfg.qk_norm:
            out[a + "q_norm.weight"] = attn.q_norm.weight
            out[a + "k_norm.weight"] = attn.k_norm.weight
        out[a + "o_proj.weight"] = attn.o_proj.dense_weight()
        if cfg.is_moe_layer(i):
            out[p + "mlp.gate.weight"] = layer.mlp.gate.dense_weight()
            for e, expert in enumerate(layer.mlp.experts):
                put_mlp(expert, p + f"mlp.experts.{e}.")
        else:
            put_mlp(layer.mlp, p + "mlp.")
    return {k: v.detach() for k, v in out.items()}
