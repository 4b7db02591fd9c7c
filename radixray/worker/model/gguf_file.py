"""Read a GGUF file's weights (llama.cpp's format; architectures llama, qwen2, qwen3, qwen3moe),
dequantised under HF names; the hyperparameters and the tokenizer come from
``radixray.model_meta.gguf_meta`` (the same reader).

For ``llama`` llama.cpp stores ``attn_q``/``attn_k`` rows permuted for its interleaved RoPE: within
each head it interleaves the two rotate-half halves, ``[x0, x_{D/2}, x1, x_{D/2+1}, ...]``. We undo
that so the model uses the rotate-half layout of HF checkpoints::

    w.reshape(n_head, D // 2, 2, dim).transpose(1, 2).reshape(w.shape)

The Qwen architectures use rotate-half RoPE in llama.cpp too ("NEOX"), so their rows are stored
as HF has them. A MoE layer's experts are one 3-D tensor per projection (``ffn_gate_exps``
``[E, I, H]``, ...), split here into HF's per-expert names.
"""

from __future__ import annotations

import numpy as np
import torch

from radixray.model_meta.gguf_meta import GGUFMetadata
from radixray.model_meta.model_config import ModelConfig, UnsupportedModelError

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
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
}
# a MoE layer's stacked experts: GGUF name -> the per-expert HF name (after "mlp.experts.{e}.")
_EXPERT_NAMES = {
    "ffn_gate_exps.weight": "gate_proj.weight",
    "ffn_up_exps.weight": "up_proj.weight",
    "ffn_down_exps.weight": "down_proj.weight",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def unpermute_qk(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's per-head q/k row permutation (interleaved -> rotate-half RoPE pairs)."""
    rows, dim = w.shape
    head_dim = rows // n_head
    return w.reshape(n_head, head_dim // 2, 2, dim).transpose(1, 2).reshape(rows, dim)


class GGUFCheckpoint(GGUFMetadata):
    """A GGUF file's metadata (``GGUFMetadata``: config, tokenizer) and its weights."""

    def hf_state_dict(self, config: ModelConfig) -> dict[str, torch.Tensor]:
        """Every tensor dequantised to float32 under its HF name, q/k un-permuted."""
        out: dict[str, torch.Tensor] = {}
        for t in self.reader.tensors:
            if t.name == "rope_freqs.weight":
                continue  # RoPE's frequency divisors: read into the config (gguf_meta)
            name = _hf_name(t.name)
            if name is None:
                raise UnsupportedModelError(f"{self.path.name}: unexpected tensor {t.name!r}")
            w = self._gguf.quants.dequantize(t.data, t.tensor_type)
            w = np.ascontiguousarray(w, dtype=np.float32)
            if not w.flags.writeable:  # F32 tensors come straight from the read-only mmap
                w = w.copy()
            w = torch.from_numpy(w)
            expected = tuple(int(d) for d in reversed(t.shape))  # ggml lists dims fastest first
            if tuple(w.shape) != expected:
                w = w.reshape(expected)
            if self.architecture == "llama" and t.name.endswith("attn_q.weight"):
                w = unpermute_qk(w, config.num_heads)
            elif self.architecture == "llama" and t.name.endswith("attn_k.weight"):
                w = unpermute_qk(w, config.num_kv_heads)
            if "{e}" in name:
                out.update((name.format(e=e), w[e]) for e in range(w.shape[0]))
            else:
                out[name] = w
        return out


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name in _TOP_NAMES:
        return _TOP_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _EXPERT_NAMES:
        return f"model.layers.{parts[1]}.mlp.experts.{{e}}.{_EXPERT_NAMES[parts[2]]}"
    return None
