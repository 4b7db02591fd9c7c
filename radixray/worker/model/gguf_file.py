"""Read a Llama-family GGUF file (llama.cpp's format): hyperparameters, dequantised weights under
HF names, and the tokenizer, from one ``gguf.GGUFReader`` pass.

llama.cpp stores ``attn_q``/``attn_k`` rows permuted for its interleaved RoPE: within each head it
interleaves the two rotate-half halves, ``[x0, x_{D/2}, x1, x_{D/2+1}, ...]``. We undo that so the
model uses the rotate-half layout of HF checkpoints::

    w.reshape(n_head, D // 2, 2, dim).transpose(1, 2).reshape(w.shape)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from .config import ModelConfig

__all__ = ["GGUFCheckpoint", "unpermute_qk"]

# GGUF tensor name (after "blk.{i}.") -> HF LlamaForCausalLM name (after "model.layers.{i}.").
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_ARCHITECTURES = ("llama",)


def unpermute_qk(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's per-head q/k row permutation (interleaved -> rotate-half RoPE pairs)."""
    rows, dim = w.shape
    head_dim = rows // n_head
    return w.reshape(n_head, head_dim // 2, 2, dim).transpose(1, 2).reshape(rows, dim)


class GGUFCheckpoint:
    """An open GGUF file. Parsing the metadata takes a few seconds (SmolLM2: 49k vocab strings),
    so the config, weights and tokenizer all come from this one reader."""

    def __init__(self, path: str | Path) -> None:
        import gguf  # imported here: only GGUF loading needs it

        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"GGUF file not found: {self.path}")
        self._gguf = gguf
        self.reader = gguf.GGUFReader(str(self.path))
        self.architecture = self.meta("general.architecture")
        if self.architecture not in _ARCHITECTURES:
            raise NotImplementedError(
                f"{self.path.name}: GGUF architecture {self.architecture!r} is not supported; "
                f"expected one of {_ARCHITECTURES}"
            )

    def meta(self, key: str, default: Any = None) -> Any:
        field = self.reader.fields.get(key)
        return default if field is None else field.contents()

    def _arch(self, key: str, default: Any = None) -> Any:
        return self.meta(f"{self.architecture}.{key}", default)

    def config(self) -> ModelConfig:
        tensors = {t.name: t for t in self.reader.tensors}
        if "rope_freqs.weight" in tensors or self._arch("rope.scaling.type") not in (None, "none"):
            raise NotImplementedError(
                f"{self.path.name}: RoPE scaling (rope_freqs / rope.scaling.type="
                f"{self._arch('rope.scaling.type')!r}) is not supported"
            )
        hidden = int(self._arch("embedding_length"))
        heads = int(self._arch("attention.head_count"))
        head_dim = int(self._arch("attention.key_length", hidden // heads))
        rope_dim = int(self._arch("rope.dimension_count", head_dim))
        if rope_dim != head_dim:
            raise NotImplementedError(
                f"{self.path.name}: partial RoPE (rope.dimension_count={rope_dim}, "
                f"head_dim={head_dim}) is not supported"
            )
        vocab = int(tensors["token_embd.weight"].shape[-1])  # ggml order: [hidden, vocab]

        def token_id(name: str) -> int | None:
            value = self.meta(f"tokenizer.ggml.{name}")
            return int(value) if value is not None else None

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
            eos_token_id=token_id("eos_token_id"),
            pad_token_id=token_id("padding_token_id"),
            name=str(self.meta("general.name", self.path.stem)),
        )

    def hf_state_dict(self, config: ModelConfig) -> dict[str, torch.Tensor]:
        """Every tensor dequantised to float32 under its HF name, q/k un-permuted."""
        out: dict[str, torch.Tensor] = {}
        for t in self.reader.tensors:
            name = _hf_name(t.name)
            if name is None:
                raise NotImplementedError(f"{self.path.name}: unexpected tensor {t.name!r}")
            w = self._gguf.quants.dequantize(t.data, t.tensor_type)
            w = np.ascontiguousarray(w, dtype=np.float32)
            if not w.flags.writeable:  # F32 tensors come straight from the read-only mmap
                w = w.copy()
            w = torch.from_numpy(w)
            expected = tuple(int(d) for d in reversed(t.shape))  # ggml lists dims fastest first
            if tuple(w.shape) != expected:
                w = w.reshape(expected)
            if t.name.endswith("attn_q.weight"):
                w = unpermute_qk(w, config.num_heads)
            elif t.name.endswith("attn_k.weight"):
                w = unpermute_qk(w, config.num_kv_heads)
            out[name] = w
        return out

    def tokenizer(self):
        from .tokenizer import BPETokenizer

        return BPETokenizer.from_gguf(self.reader)


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name in _TOP_NAMES:
        return _TOP_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    return None
