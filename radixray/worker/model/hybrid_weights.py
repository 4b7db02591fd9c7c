"""The hybrid families' weights under transformers' checkpoint names, in and out (hf_weights.py
is the same for the attention-only families).

One table per family binds each of our parameters to the checkpoint tensors it is made of::

    ours                                   checkpoint (model.layers.{i}. omitted)
    layers.i.self_attn.qkv_proj.weight  =  cat(self_attn.{q,k,v}_proj.weight)       "cat"
    layers.i.mlp.experts.{e}.*.weight   =  block_sparse_moe.input_linear.weight[e]  "stack"
    layers.i.mixer.conv_weight          =  conv.conv.weight  (LFM2; Granite: mamba.conv1d)

Loading checks every shape against the model's own (built on the meta device); exporting gives
the checkpoint's names and tensors back exactly. Granite's MoE is accepted under transformers
5's in-memory names too (``experts.gate_up_proj``, ``router.weight``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch
from torch import nn

from radixray.model_meta.model_config import ModelConfig

__all__ = [
    "HYBRID_ARCHITECTURES",
    "export_hybrid_weights",
    "hybrid_bindings",
    "load_hybrid_weights",
]

HYBRID_ARCHITECTURES = ("lfm2", "granitemoehybrid")


class Bind(NamedTuple):
    """``ours[0] = cat(hf)`` along dim 0 (``sizes``: each piece's rows), or with several
    ``ours``, ``ours[e] = hf[0][e]`` (experts stacked in one checkpoint tensor)."""

    ours: tuple[str, ...]
    hf: tuple[str, ...]
    sizes: tuple[int, ...] = ()


def _one(ours: str, hf: str) -> Bind:
    return Bind((ours,), (hf,))


def _attention(cfg: ModelConfig, o: str, p: str, out: str, norms: tuple[str, str]) -> list[Bind]:
    names = tuple(p + f"self_attn.{n}_proj.weight" for n in "qkv")
    sizes = (cfg.q_size, cfg.kv_size, cfg.kv_size)
    binds = [
        Bind((o + "self_attn.qkv_proj.weight",), names, sizes),
        _one(o + "self_attn.o_proj.weight", p + f"self_attn.{out}.weight"),
    ]
    if cfg.qk_norm:
        binds += [
            _one(o + f"self_attn.{n}_norm.weight", p + f"self_attn.{hf}.weight")
            for n, hf in zip("qk", norms, strict=True)
        ]
    return binds


def _linear(o: str, p: str, bias: bool) -> list[Bind]:
    binds = [_one(o + ".weight", p + ".weight")]
    return binds + [_one(o + ".bias", p + ".bias")] if bias else binds


def _lfm2_layer(cfg: ModelConfig, i: int) -> list[Bind]:
    o, p = f"layers.{i}.", f"model.layers.{i}."
    I = cfg.intermediate_size  # noqa: E741
    binds = [
        _one(o + "input_layernorm.weight", p + "operator_norm.weight"),
        _one(o + "post_attention_layernorm.weight", p + "ffn_norm.weight"),
        Bind(
            (o + "mlp.gate_up_proj.weight",),
            (p + "feed_forward.w1.weight", p + "feed_forward.w3.weight"),
            (I, I),
        ),
        _one(o + "mlp.down_proj.weight", p + "feed_forward.w2.weight"),
    ]
    if cfg.layer_kind(i) == "attention":
        return binds + _attention(cfg, o, p, "out_proj", ("q_layernorm", "k_layernorm"))
    bias = cfg.short_conv.bias
    binds += _linear(o + "mixer.in_proj", p + "conv.in_proj", bias)
    binds += _linear(o + "mixer.out_proj", p + "conv.out_proj", bias)
    binds.append(_one(o + "mixer.conv_weight", p + "conv.conv.weight"))
    return binds + ([_one(o + "mixer.conv_bias", p + "conv.conv.bias")] if bias else [])


def _mamba(cfg: ModelConfig, o: str, p: str) -> list[Bind]:
    spec, m, q = cfg.mamba, o + "mixer.", p + "mamba."
    binds = _linear(m + "in_proj", q + "in_proj", spec.proj_bias)
    binds += _linear(m + "out_proj", q + "out_proj", spec.proj_bias)
    binds += [_one(m + n, q + n) for n in ("dt_bias", "A_log", "D")]
    binds += [
        _one(m + "conv_weight", q + "conv1d.weight"),
        _one(m + "norm_weight", q + "norm.weight"),
    ]
    return binds + ([_one(m + "conv_bias", q + "conv1d.bias")] if spec.conv_bias else [])


def _granite_ffn(cfg: ModelConfig, o: str, p: str) -> list[Bind]:
    shared = o + ("mlp.shared." if cfg.num_experts else "mlp.")
    binds = [
        _one(shared + "gate_up_proj.weight", p + "shared_mlp.input_linear.weight"),
        _one(shared + "down_proj.weight", p + "shared_mlp.output_linear.weight"),
    ]
    if not cfg.num_experts:
        return binds
    moe, E = p + "block_sparse_moe.", range(cfg.num_experts)
    return binds + [
        _one(o + "mlp.gate.weight", moe + "router.layer.weight"),
        Bind(
            tuple(o + f"mlp.experts.{e}.gate_up_proj.weight" for e in E),
            (moe + "input_linear.weight",),
        ),
        Bind(
            tuple(o + f"mlp.experts.{e}.down_proj.weight" for e in E),
            (moe + "output_linear.weight",),
        ),
    ]


def _granite_layer(cfg: ModelConfig, i: int) -> list[Bind]:
    o, p = f"layers.{i}.", f"model.layers.{i}."
    binds = [
        _one(o + f"{n}.weight", p + f"{n}.weight")
        for n in ("input_layernorm", "post_attention_layernorm")
    ]
    if cfg.layer_kind(i) == "attention":
        binds += _attention(cfg, o, p, "o_proj", ("", ""))
    else:
        binds += _mamba(cfg, o, p)
    return binds + _granite_ffn(cfg, o, p)


def hybrid_bindings(cfg: ModelConfig) -> list[Bind]:
    """Every parameter of a hybrid ``cfg``'s model and the checkpoint tensors it comes from."""
    lfm2 = cfg.architecture == "lfm2"
    binds = [
        _one("embed_tokens.weight", "model.embed_tokens.weight"),
        _one("norm.weight", "model.embedding_norm.weight" if lfm2 else "model.norm.weight"),
    ]
    if not cfg.tie_word_embeddings:
        binds.append(_one("lm_head.weight", "lm_head.weight"))
    layer = _lfm2_layer if lfm2 else _granite_layer
    for i in range(cfg.num_layers):
        binds += layer(cfg, i)
    return binds


# transformers 5's in-memory names for Granite's MoE -> the checkpoint's
_ALIASES = {
    "block_sparse_moe.experts.gate_up_proj": "block_sparse_moe.input_linear.weight",
    "block_sparse_moe.experts.down_proj": "block_sparse_moe.output_linear.weight",
    "block_sparse_moe.router.weight": "block_sparse_moe.router.layer.weight",
}


def _canonical(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name, w in state.items():
        for alias, real in _ALIASES.items():
            if name.endswith(alias):
                name = name[: -len(alias)] + real
                break
        out[name] = w
    return out


def load_hybrid_weights(model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy ``state`` (checkpoint names) into ``model`` on its device and dtype; every tensor
    the family's table names must be present, in the shape the model expects."""
    cfg: ModelConfig = model.config
    state = _canonical(state)
    binds = hybrid_bindings(cfg)
    missing = [n for b in binds for n in b.hf if n not in state]
    if missing:
        raise KeyError(f"state dict lacks {len(missing)} weights, e.g. {missing[:4]}")
    for b in binds:
        pieces = [state[n] for n in b.hf]
        values = (
            [torch.cat(pieces)] if len(b.hf) > 1 else list(pieces[0]) if len(b.ours) > 1 else pieces
        )
        for ours, w in zip(b.ours, values, strict=True):
            expected = tuple(model.get_parameter(ours).shape)
            if tuple(w.shape) != expected:
                raise ValueError(
                    f"{b.hf}: expected shape {expected} for {ours}, got {tuple(w.shape)}"
                )
            module, _, attr = ours.rpartition(".")
            w = w.to(model.device, model.dtype).contiguous()
            setattr(model.get_submodule(module), attr, nn.Parameter(w, requires_grad=False))
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight


def _dense(p: torch.Tensor) -> torch.Tensor:
    p = p.detach()
    return p.to_dense() if p.is_mkldnn else p


def export_hybrid_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The weights under the checkpoint's names, exactly as loaded."""
    out: dict[str, torch.Tensor] = {}
    for b in hybrid_bindings(model.config):
        ours = [_dense(model.get_parameter(n)) for n in b.ours]
        if len(b.hf) > 1:
            out.update(zip(b.hf, ours[0].split(list(b.sizes)), strict=True))
        else:
            out[b.hf[0]] = torch.stack(ours) if len(ours) > 1 else ours[0]
    return out
