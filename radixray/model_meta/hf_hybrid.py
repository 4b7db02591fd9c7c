"""The hybrid families' config.json (recurrent-state layers beside attention; state_layers.py):

    lfm2              LFM2: gated short-convolution layers and GQA layers with q/k norms, RoPE
    granitemoehybrid  Granite 4.0(-H): Mamba2 layers and GQA layers (RoPE or none), Granite's
                      embedding / residual / attention multipliers and logits scaling, a
                      shared MLP beside a sparse MoE (or alone when there are no experts)

Each function returns the ModelConfig fields that differ from the base decoder's reading in
hf_meta.py (they replace it where both name a field). Layer kinds come as transformers 5 writes
them (``full_attention``, ``conv``, ``linear_attention``) or as checkpoints on the hub do
(``attention``, ``mamba``; Granite's older ``layers_block_type``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .state_layers import Mamba2Spec, ShortConvSpec

__all__ = ["HYBRID_FAMILIES", "granite_hybrid_fields", "hybrid_fields", "lfm2_fields"]

_KINDS = {
    "full_attention": "attention",
    "attention": "attention",
    "sliding_attention": "attention",  # a window layer: ModelConfig refuses it beside state layers
    "conv": "conv",
    "linear_attention": "mamba",
    "mamba": "mamba",
}


def _kinds(types: list[str], refuse: Callable[[str], Exception]) -> tuple[str, ...]:
    unknown = sorted({t for t in types if t not in _KINDS})
    if unknown:
        raise refuse(f"layer types {unknown} are not supported (known: {sorted(_KINDS)})")
    return tuple(_KINDS[t] for t in types)


def _lfm2_intermediate(c: dict[str, Any]) -> int:
    """The MLP's width as Lfm2MLP derives it: 2/3 of ``intermediate_size`` (or
    ``block_ff_dim``), times ``block_ffn_dim_multiplier``, rounded up to ``block_multiple_of``
    when ``block_auto_adjust_ff_dim``."""
    width = int(c.get("block_ff_dim") or c["intermediate_size"])
    if not c.get("block_auto_adjust_ff_dim", True):
        return width
    width = int(2 * width / 3)
    multiplier = c.get("block_ffn_dim_multiplier", 1.0)
    if multiplier is not None:
        step = int(c.get("block_multiple_of", 256))
        width = step * ((int(multiplier * width) + step - 1) // step)
    return width


def lfm2_fields(c: dict[str, Any], refuse: Callable[[str], Exception]) -> dict[str, Any]:
    """LFM2's fields: conv layers where ``layer_types`` (or ``full_attn_idxs``) says, q/k
    norms, ``norm_eps``, its MLP width rule, tied embeddings (``tie_embedding`` too)."""
    n = int(c["num_hidden_layers"])
    types = c.get("layer_types")
    if not types:
        full = c.get("full_attn_idxs")
        full = set(range(n)) if full is None else set(full)
        types = ["full_attention" if i in full else "conv" for i in range(n)]
    rope = c.get("rope_parameters") or {}
    tie = c.get("tie_embedding", c.get("tie_word_embeddings", True))
    return {
        "layer_kinds": _kinds(list(types), refuse),
        "short_conv": ShortConvSpec(int(c.get("conv_L_cache", 3)), bool(c.get("conv_bias"))),
        "qk_norm": True,
        "intermediate_size": _lfm2_intermediate(c),
        "rms_norm_eps": float(c.get("norm_eps", 1e-5)),
        "rope_theta": float(c.get("rope_theta") or rope.get("rope_theta") or 1_000_000.0),
        "tie_word_embeddings": bool(tie),
    }


def _limit(value: Any) -> float:
    """A time step limit: a number, None (no limit) or transformers 5's ``{"__float__":
    "Infinity"}`` tag for the float JSON cannot write."""
    if value is None:
        return math.inf
    if isinstance(value, dict):
        return float(value["__float__"].replace("Infinity", "inf"))
    return float(value)


def _mamba(c: dict[str, Any]) -> Mamba2Spec:
    heads = int(c.get("mamba_n_heads", 128))
    inner = int(c.get("mamba_expand", 2)) * int(c["hidden_size"])
    head_dim = c.get("mamba_d_head", "auto")
    head_dim = inner // heads if head_dim in (None, "auto") else int(head_dim)
    low, high = c.get("time_step_limit") or (0.0, None)
    return Mamba2Spec(
        num_heads=heads,
        head_dim=head_dim,
        state_size=int(c.get("mamba_d_state", 256)),
        n_groups=int(c.get("mamba_n_groups", 1)),
        conv_kernel=int(c.get("mamba_d_conv", 4)),
        conv_bias=bool(c.get("mamba_conv_bias", True)),
        proj_bias=bool(c.get("mamba_proj_bias", False)),
        chunk_size=int(c.get("mamba_chunk_size", 256)),
        dt_min=_limit(low) if low is not None else 0.0,
        dt_max=_limit(high),
    )


def granite_hybrid_fields(c: dict[str, Any], refuse: Callable[[str], Exception]) -> dict[str, Any]:
    """Granite 4.0(-H)'s fields. The dense MLP is the shared one (``shared_intermediate_size``);
    ``intermediate_size`` is each expert's width; the router's softmax over the top-k logits is
    a softmax renormalised over the top k (``norm_topk_prob``)."""
    n = int(c["num_hidden_layers"])
    types = c.get("layer_types") or c.get("layers_block_type") or ["mamba"] * n
    kinds = _kinds(list(types), refuse)
    inner = int(c.get("mamba_expand", 2)) * int(c["hidden_size"])
    if "mamba" in kinds and c.get("hidden_act", "silu") != "silu":
        raise refuse(f"hidden_act {c['hidden_act']!r} in Mamba2 layers is not supported")
    experts = int(c.get("num_local_experts") or 0)
    moe: dict[str, Any] = {}
    if experts:
        moe = {
            "num_experts": experts,
            "num_experts_per_tok": int(c["num_experts_per_tok"]),
            "moe_intermediate_size": int(c["intermediate_size"]),
            "norm_topk_prob": True,
            "moe_shared_mlp": True,
        }
    spec = _mamba(c) if "mamba" in kinds else None
    if spec is not None and spec.inner != inner:
        raise refuse(f"mamba_n_heads * mamba_d_head = {spec.inner} != mamba_expand * hidden")
    return moe | {
        "layer_kinds": kinds,
        "mamba": spec,
        "intermediate_size": int(c.get("shared_intermediate_size", 1024)),
        "use_rope": c.get("position_embedding_type") == "rope",
        "embed_scale": float(c.get("embedding_multiplier") or 1.0),
        "attn_scale": float(c.get("attention_multiplier") or 1.0),
        "residual_multiplier": float(c.get("residual_multiplier") or 1.0),
        "logits_scaling": float(c.get("logits_scaling") or 1.0),
    }


HYBRID_FAMILIES = {"lfm2": lfm2_fields, "granitemoehybrid": granite_hybrid_fields}


def hybrid_fields(
    model_type: str, c: dict[str, Any], refuse: Callable[[str], Exception]
) -> dict[str, Any]:
    """The fields of a hybrid ``model_type`` (one of :data:`HYBRID_FAMILIES`)."""
    return HYBRID_FAMILIES[model_type](c, refuse)
