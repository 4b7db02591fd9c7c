"""A GGUF file's metadata (llama.cpp's format): hyperparameters and tokenizer, no weights.

The router reads this much of a checkpoint; the worker's ``GGUFCheckpoint`` adds the weights.
The config and the tokenizer come from one ``GGUFFile`` (gguf_reader.py: it maps the file and
reads SmolLM2's 49k-string vocabulary in ~0.1 s, where ``gguf.GGUFReader`` took seconds; no
tensor data is read here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .model_config import ModelConfig, UnsupportedModelError

__all__ = ["GGUF_ARCHITECTURES", "GGUFMetadata"]

# general.architecture -> the HF model_type of the same family member (docs/models.md).
GGUF_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3moe": "qwen3_moe"}


class GGUFMetadata:
    def __init__(self, path: str | Path) -> None:
        import gguf  # imported here: only GGUF files need it

        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"GGUF file not found: {self.path}")
        self._gguf = gguf
        from .gguf_reader import GGUFFile  # numpy: only a process that opens a GGUF pays for it

        self.reader = GGUFFile(self.path)
        self.architecture = self.meta("general.architecture")
        if self.architecture not in GGUF_ARCHITECTURES:
            raise UnsupportedModelError(
                f"{self.path.name}: GGUF architecture {self.architecture!r} is not supported; "
                f"supported: {', '.join(GGUF_ARCHITECTURES)}"
            )

    def meta(self, key: str, default: Any = None) -> Any:
        field = self.reader.fields.get(key)
        return default if field is None else field.contents()

    def _arch(self, key: str, default: Any = None) -> Any:
        return self.meta(f"{self.architecture}.{key}", default)

    def config(self) -> ModelConfig:
        tensors = {t.name: t for t in self.reader.tensors}
        scaling = self._arch("rope.scaling.type")
        if scaling not in (None, "none", "linear"):
            raise UnsupportedModelError(
                f"{self.path.name}: RoPE scaling (rope.scaling.type={scaling!r}) is not supported"
            )
        hidden = int(self._arch("embedding_length"))
        heads = int(self._arch("attention.head_count"))
        head_dim = int(self._arch("attention.key_length", hidden // heads))
        rope_dim = int(self._arch("rope.dimension_count", head_dim))
        if rope_dim != head_dim:
            raise UnsupportedModelError(
                f"{self.path.name}: partial RoPE (rope.dimension_count={rope_dim}, "
                f"head_dim={head_dim}) is not supported"
            )
        vocab = int(tensors["token_embd.weight"].shape[-1])  # ggml order: [hidden, vocab]

        def token_id(name: str) -> int | None:
            value = self.meta(f"tokenizer.ggml.{name}")
            return int(value) if value is not None else None

        eos = token_id("eos_token_id")
        return ModelConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=int(self._arch("feed_forward_length")),
            num_layers=int(self._arch("block_count")),
            num_heads=heads,
            num_kv_heads=int(self._arch("attention.head_count_kv", heads)),
            head_dim=head_dim,
            rope_theta=float(self._arch("rope.freq_base", 10000.0)),
            rms_norm_eps=float(self._arch("attention.layer_norm_rms_epsilon", 1e-5)),
            max_position_embeddings=int(self._arch("context_length", 2048)),
            tie_word_embeddings="output.weight" not in tensors,
            bos_token_id=token_id("bos_token_id"),
            eos_token_id=eos,
            pad_token_id=token_id("padding_token_id"),
            name=str(self.meta("general.name", self.path.stem)),
            stop_token_ids=(eos,) if eos is not None else (),
            rope_freq_factors=self._rope_freq_factors(tensors, head_dim),
            **self._flags(tensors),
        )

    def _rope_freq_factors(self, tensors, head_dim: int) -> tuple[float, ...]:
        """RoPE's per-frequency divisors: ``rope_freqs.weight`` (llama.cpp's converter writes
        Llama 3.1's scaling so), or linear scaling's one factor for all."""
        if "rope_freqs.weight" in tensors:
            t = tensors["rope_freqs.weight"]
            if t.tensor_type != self._gguf.GGMLQuantizationType.F32:
                raise UnsupportedModelError(f"{self.path.name}: rope_freqs.weight is not F32")
            return tuple(float(x) for x in t.data.reshape(-1).view("<f4"))
        if self._arch("rope.scaling.type") == "linear":
            return (float(self._arch("rope.scaling.factor")),) * (head_dim // 2)
        return ()

    def _flags(self, tensors) -> dict[str, Any]:
        """What sets this family member apart (ModelConfig's flags), from its tensors and keys."""
        arch = GGUF_ARCHITECTURES[self.architecture]
        flags: dict[str, Any] = {
            "architecture": arch,
            "qkv_bias": "blk.0.attn_q.bias" in tensors,
            "qk_norm": "blk.0.attn_q_norm.weight" in tensors,
        }
        if arch == "qwen3_moe":
            n = int(self._arch("block_count"))
            flags |= {
                "num_experts": int(self._arch("expert_count")),
                "num_experts_per_tok": int(self._arch("expert_used_count")),
                "moe_intermediate_size": int(self._arch("expert_feed_forward_length")),
                # llama.cpp always renormalises Qwen3-MoE's top-k weights (as its HF configs ask)
                "norm_topk_prob": bool(self._arch("expert_weights_norm", True)),
                "dense_layers": tuple(
                    i for i in range(n) if f"blk.{i}.ffn_gate_inp.weight" not in tensors
                ),
            }
        return flags

    def tokenizer(self):
        from .tokenizer import BPETokenizer

        return BPETokenizer.from_gguf(self.reader)
