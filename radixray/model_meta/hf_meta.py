"""An HF transformers Llama directory's metadata: ``config.json`` and the tokenizer files.

Weights are not needed here (a router can run from a directory holding only the config and
the tokenizer); the worker's ``HFCheckpoint`` adds the ``*.safetensors``.
"""

from __future__ import annotations

import json
from pathlib import Path

from .model_config import ModelConfig

__all__ = ["HFMetadata"]

_MODEL_TYPES = ("llama",)


class HFMetadata:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        cfg_file = self.path / "config.json"
        if not cfg_file.is_file():
            raise FileNotFoundError(f"{self.path} is not an HF checkpoint: no config.json")
        self.raw = json.loads(cfg_file.read_text())

    def config(self) -> ModelConfig:
        c = self.raw
        if c.get("model_type") not in _MODEL_TYPES:
            raise NotImplementedError(
                f"{self.path}: model_type {c.get('model_type')!r} is not supported; "
                f"expected one of {_MODEL_TYPES}"
            )
        for flag in ("attention_bias", "mlp_bias"):
            if c.get(flag):
                raise NotImplementedError(f"{self.path}: {flag}=true is not supported")
        if c.get("hidden_act", "silu") != "silu":
            raise NotImplementedError(f"{self.path}: hidden_act {c['hidden_act']!r} != 'silu'")
        # transformers 4.x writes rope_theta / rope_scaling; 5.x writes rope_parameters.
        rope = c.get("rope_parameters") or {}
        scaling = c.get("rope_scaling") or {}
        rope_type = rope.get("rope_type") or scaling.get("rope_type") or scaling.get("type")
        if rope_type not in (None, "default"):
            raise NotImplementedError(f"{self.path}: RoPE scaling {rope_type!r} is not supported")
        heads = int(c["num_attention_heads"])
        eos = c.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        return ModelConfig(
            vocab_size=int(c["vocab_size"]),
            hidden_size=int(c["hidden_size"]),
            intermediate_size=int(c["intermediate_size"]),
            num_layers=int(c["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(c.get("num_key_value_heads") or heads),
            head_dim=int(c.get("head_dim") or c["hidden_size"] // heads),
            rope_theta=float(c.get("rope_theta") or rope.get("rope_theta") or 10000.0),
            rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(c.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
            bos_token_id=c.get("bos_token_id"),
            eos_token_id=eos,
            pad_token_id=c.get("pad_token_id"),
            name=str(c.get("_name_or_path") or self.path.name),
        )

    def tokenizer(self):
        from .tokenizer import BPETokenizer

        return BPETokenizer.from_hf_dir(self.path)
