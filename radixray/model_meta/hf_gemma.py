"""Gemma 3's config.json, in both of transformers' forms: ``gemma3_text`` (Gemma3ForCausalLM),
and ``gemma3`` (Gemma3ForConditionalGeneration: the text model's fields nested in
``text_config``, often sparsely, beside a vision tower whose weights a text worker ignores).

What it adds to the decoder family (docs/models.md): interleaved sliding-window ("local") and
global layers, each kind with its own RoPE base (the global one possibly with linear scaling),
GeGLU, a norm after the attention and around the MLP, ``(1 + w)`` RMSNorms (q/k per head too),
embeddings scaled by ``sqrt(hidden)``, the softmax scaled by ``query_pre_attn_scalar ** -0.5``.
RoPE comes as transformers 5 writes it (``rope_parameters`` per layer type) or as 4.x did
(``rope_theta``, ``rope_local_base_freq``, ``rope_scaling``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["GEMMA3_DEFAULTS", "gemma3_text_config", "gemma3_fields"]

# Gemma3TextConfig's defaults: a nested text_config writes only what differs from them.
GEMMA3_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "sliding_window_pattern": 6,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "tie_word_embeddings": True,
}


def gemma3_text_config(raw: dict[str, Any]) -> dict[str, Any]:
    """The text model's fields of a ``gemma3`` or ``gemma3_text`` config, defaults filled in."""
    if raw.get("model_type") == "gemma3":
        text = dict(raw.get("text_config") or {})
        for key in ("eos_token_id", "bos_token_id", "pad_token_id", "tie_word_embeddings"):
            if key not in text and raw.get(key) is not None:
                text[key] = raw[key]
    else:
        text = dict(raw)
    return GEMMA3_DEFAULTS | {k: v for k, v in text.items() if v is not None}


def _rope(c: dict[str, Any], layer_type: str) -> tuple[float, float, str]:
    """(theta, linear factor, rope type) of one layer type."""
    params = (c.get("rope_parameters") or {}).get(layer_type)
    if params is None:  # transformers 4.x fields
        if layer_type == "sliding_attention":
            return float(c["rope_local_base_freq"]), 1.0, "default"
        params = {"rope_theta": c["rope_theta"], **(c.get("rope_scaling") or {})}
    kind = params.get("rope_type") or params.get("type") or "default"
    factor = float(params.get("factor", 1.0)) if kind == "linear" else 1.0
    return float(params["rope_theta"]), factor, kind


def _rope2(c: dict[str, Any]) -> tuple[float, float, str]:
    """Gemma 2's one RoPE for every layer: ``rope_parameters`` (5.x) or ``rope_theta`` (4.x)."""
    params = c.get("rope_parameters") or {"rope_theta": c.get("rope_theta", 10000.0)}
    kind = params.get("rope_type") or "default"
    return float(params.get("rope_theta", c.get("rope_theta", 10000.0))), 1.0, kind


def gemma3_fields(c: dict[str, Any], refuse) -> dict[str, Any]:
    """ModelConfig's Gemma 3 (or Gemma 2) fields from a text config (``gemma3_text_config``, or
    a ``gemma2`` config as it is); ``refuse(what)`` makes the exception for a setting the worker
    does not run. Gemma 2 differs in: no q/k norms, one RoPE base, every other layer local,
    attention scores soft-capped (``attn_logit_softcapping``)."""
    n = int(c["num_hidden_layers"])
    gemma2 = c.get("model_type") == "gemma2"
    pattern = 2 if gemma2 else int(c["sliding_window_pattern"])
    layer_types = c.get("layer_types") or [
        "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)
    ]
    if c.get("use_bidirectional_attention"):
        raise refuse("use_bidirectional_attention=true (an encoder) is not supported")
    act = c.get("hidden_activation") or c.get("hidden_act")
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise refuse(f"hidden_activation {act!r} is not supported (Gemma 3 uses gelu_pytorch_tanh)")
    ropes = {}
    for kind in set(layer_types):
        theta, factor, rope_type = _rope2(c) if gemma2 else _rope(c, kind)
        if rope_type not in ("default", "linear"):
            raise refuse(f"RoPE scaling {rope_type!r} ({kind} layers) is not supported")
        ropes[kind] = (theta, factor)
    window = int(c["sliding_window"])
    final_cap = c.get("final_logit_softcapping")
    attn_cap = c.get("attn_logit_softcapping")
    return {
        "qk_norm": not gemma2,
        "sandwich_norms": True,
        "norm_offset": 1.0,
        "hidden_act": "gelu_tanh",
        "embed_scale": float(c["hidden_size"]) ** 0.5,
        "attn_scale": float(c["query_pre_attn_scalar"]) ** -0.5,
        "final_logit_softcap": float(final_cap) if final_cap is not None else None,
        "attn_logit_softcap": float(attn_cap) if attn_cap is not None else None,
        "layer_windows": tuple(window if t == "sliding_attention" else None for t in layer_types),
        "layer_rope": tuple(ropes[t] for t in layer_types),
    }
