"""An HF transformers directory's metadata: ``config.json`` (+ ``generation_config.json``) and the
tokenizer files, read into a :class:`ModelConfig` for the architectures the worker runs.

Weights are not needed here (a router can run from a directory holding only the config and
the tokenizer); the worker's ``HFCheckpoint`` adds the ``*.safetensors``. The members of the
family differ only in the flags read here (docs/models.md):

    llama, mistral   the base decoder
    qwen2            + biases on q, k, v
    qwen3            + an RMSNorm over each head of q and k
    qwen3_moe        + qwen3's norms, and a sparse mixture of experts in place of the MLP
    gemma3_text      + interleaved window/global layers, sandwich (1 + w) norms, GeGLU, ...
    gemma3           the same, nested in text_config (hf_gemma.py)
    gemma2           gemma3's, without q/k norms, with soft-capped attention scores
    lfm2, granitemoehybrid   hybrids: recurrent-state layers beside attention (hf_hybrid.py)

Sliding-window layers (Gemma 3's local layers; Mistral's or Qwen's windows) are decided as
transformers decides them and attend to their window (worker/model/window.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .hf_gemma import gemma3_fields, gemma3_text_config
from .hf_hybrid import HYBRID_FAMILIES, hybrid_fields
from .model_config import ModelConfig, UnsupportedModelError
from .rope_scaling import SCALED_ROPE_TYPES, rope_freq_factors

__all__ = ["HFMetadata", "SUPPORTED_ARCHITECTURES"]

# HF model_type -> the flags of the family member it is (the rest come from the config's fields).
_FLAGS: dict[str, dict[str, bool]] = {
    "llama": {},
    "mistral": {},
    "qwen2": {"qkv_bias": True},
    "qwen3": {"qk_norm": True},
    "qwen3_moe": {"qk_norm": True},
    "gemma3_text": {},  # its fields: hf_gemma.gemma3_fields
    "gemma3": {},
    "gemma2": {},
    "lfm2": {},  # its fields: hf_hybrid.py
    "granitemoehybrid": {},
}
_GEMMA = ("gemma3_text", "gemma3", "gemma2")
# What a worker serves: every family read here. The hybrids (HYBRID_FAMILIES) are served with
# the state cache, mamba_radix (memory_pool.cache_kind).
SUPPORTED_ARCHITECTURES = tuple(_FLAGS)


def _ids(value: Any) -> list[int]:
    """An ``eos_token_id`` field (None, an int or a list of ints) as a list."""
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


class HFMetadata:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        cfg_file = self.path / "config.json"
        if not cfg_file.is_file():
            raise FileNotFoundError(f"{self.path} is not an HF checkpoint: no config.json")
        self.raw = json.loads(cfg_file.read_text())
        # an architecture the worker cannot run is refused on opening
        arch = self.architecture()
        self.text = gemma3_text_config(self.raw) if arch in _GEMMA[:2] else self.raw
        gen_file = self.path / "generation_config.json"
        self.generation = json.loads(gen_file.read_text()) if gen_file.is_file() else {}

    def _refuse(self, what: str) -> UnsupportedModelError:
        return UnsupportedModelError(f"{self.path}: {what}")

    def architecture(self) -> str:
        """The config's ``model_type``, if it is one the worker runs; else refused, naming it
        and the supported list."""
        c = self.raw
        model_type = c.get("model_type")
        if model_type not in _FLAGS:
            classes = ", ".join(c.get("architectures") or []) or "no architectures listed"
            raise self._refuse(
                f"architecture {model_type!r} ({classes}) is not supported; supported "
                f"model_types: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        return model_type

    def _check_supported(self, model_type: str) -> None:
        c = self.text
        if c.get("mlp_bias"):
            raise self._refuse("mlp_bias=true is not supported")
        if c.get("attention_bias") and model_type != "qwen2":
            raise self._refuse("attention_bias=true (a bias on o_proj too) is not supported")
        if model_type in _GEMMA:
            return  # hf_gemma.gemma3_fields checks the rest
        if c.get("hidden_act", "silu") != "silu":
            raise self._refuse(f"hidden_act {c['hidden_act']!r} != 'silu' is not supported")
        kind = self._rope_scaling().get("rope_type")
        if kind not in (None, "default", *SCALED_ROPE_TYPES):
            raise self._refuse(f"RoPE scaling {kind!r} is not supported")

    def _rope_scaling(self) -> dict[str, Any]:
        """The RoPE parameters, as transformers 5 writes them (``rope_parameters``) or 4.x did
        (``rope_scaling``, its type under ``rope_type`` or ``type``)."""
        c = self.text
        params = dict(c.get("rope_scaling") or {}) | dict(c.get("rope_parameters") or {})
        if "type" in params and "rope_type" not in params:
            params["rope_type"] = params["type"]
        return params

    def sliding_layers(self) -> list[int]:
        """Layers whose attention is limited to a window shorter than the context, decided as
        transformers does: ``layer_types`` when given, else Qwen's ``use_sliding_window`` from
        layer ``max_window_layers`` on, else (Mistral) ``sliding_window`` on every layer."""
        c = self.text
        n = int(c["num_hidden_layers"])
        window = c.get("sliding_window")
        if window is None or int(window) >= int(c.get("max_position_embeddings", 2048)):
            return []  # no window, or one no sequence can exceed: full attention
        layer_types = c.get("layer_types")
        if layer_types:
            return [i for i, t in enumerate(layer_types) if t == "sliding_attention"]
        if c.get("model_type", "").startswith("qwen"):
            first = int(c.get("max_window_layers", 0))
            return list(range(first, n)) if c.get("use_sliding_window") else []
        return list(range(n))

    def stop_token_ids(self) -> list[int]:
        """Every end-of-sequence id the checkpoint declares, config.json's first, then
        generation_config.json's (each may be an int or a list)."""
        ids = _ids(self.text.get("eos_token_id")) + _ids(self.generation.get("eos_token_id"))
        return list(dict.fromkeys(ids))

    def config(self) -> ModelConfig:
        c = self.text
        model_type = self.architecture()
        self._check_supported(model_type)
        rope = c.get("rope_parameters") or {}
        heads = int(c["num_attention_heads"])
        n = int(c["num_hidden_layers"])
        stops = self.stop_token_ids()
        num_experts = int(c.get("num_experts") or c.get("num_local_experts") or 0)
        moe: dict[str, Any] = {}
        if model_type == "qwen3_moe" and num_experts:
            step = int(c.get("decoder_sparse_step") or 1)
            only_mlp = set(c.get("mlp_only_layers") or ())
            moe = {
                "num_experts": num_experts,
                "num_experts_per_tok": int(c["num_experts_per_tok"]),
                "moe_intermediate_size": int(c["moe_intermediate_size"]),
                "norm_topk_prob": bool(c.get("norm_topk_prob", False)),
                "dense_layers": tuple(i for i in range(n) if i in only_mlp or (i + 1) % step),
            }
        fields = {
            "vocab_size": int(c["vocab_size"]),
            "hidden_size": int(c["hidden_size"]),
            "intermediate_size": int(c["intermediate_size"]),
            "num_layers": n,
            "num_heads": heads,
            "num_kv_heads": int(c.get("num_key_value_heads") or heads),
            "head_dim": int(c.get("head_dim") or c["hidden_size"] // heads),
            "rope_theta": float(c.get("rope_theta") or rope.get("rope_theta") or 10000.0),
            "rms_norm_eps": float(c.get("rms_norm_eps", 1e-6)),
            "max_position_embeddings": int(c.get("max_position_embeddings", 2048)),
            "tie_word_embeddings": bool(c.get("tie_word_embeddings", False)),
            "bos_token_id": c.get("bos_token_id"),
            "eos_token_id": stops[0] if stops else None,
            "pad_token_id": c.get("pad_token_id"),
            "name": str(c.get("_name_or_path") or self.path.name),
            "architecture": model_type,
            "stop_token_ids": tuple(stops),
        }
        # a family's own reading of a field (LFM2's norm_eps, say) replaces the base one
        return ModelConfig(**(fields | self._family_fields(model_type, moe)))

    def _family_fields(self, model_type: str, moe: dict[str, Any]) -> dict[str, Any]:
        """The flags of ``model_type``: its table entry, its MoE, its windows (or Gemma's)."""
        if model_type in _GEMMA:
            fields = gemma3_fields(self.text, self._refuse)
            if model_type == "gemma3":
                # transformers' Gemma3ForConditionalGeneration never soft-caps its logits (real
                # Gemma 3 configs set no cap); the text-only Gemma3ForCausalLM does
                fields["final_logit_softcap"] = None
            return fields
        fields: dict[str, Any] = {**_FLAGS[model_type], **moe}
        if model_type in HYBRID_FAMILIES:
            fields |= hybrid_fields(model_type, self.text, self._refuse)
        scaling = self._rope_scaling()
        if scaling.get("rope_type") in SCALED_ROPE_TYPES:
            c = self.text
            heads = int(c["num_attention_heads"])
            head_dim = int(c.get("head_dim") or c["hidden_size"] // heads)
            theta = float(c.get("rope_theta") or scaling.get("rope_theta") or 10000.0)
            scaling.setdefault("original_max_position_embeddings", c.get("max_position_embeddings"))
            fields["rope_freq_factors"] = rope_freq_factors(scaling, head_dim, theta)
        window = self.text.get("sliding_window")
        sliding = set(self.sliding_layers())
        n = int(self.text["num_hidden_layers"])
        windows = tuple(int(window) if i in sliding else None for i in range(n))
        return fields | {"layer_windows": windows if sliding else ()}

    def tokenizer(self):
        from .tokenizer import BPETokenizer

        return BPETokenizer.from_hf_dir(self.path, extra_stop_ids=self.stop_token_ids())
