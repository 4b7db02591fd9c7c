"""A Llama-family decoder (RMSNorm, RoPE, GQA, SwiGLU) that runs one flat varlen batch per step
against the paged KV pool.

Per layer and step::

    h [T, hidden] -> RMSNorm -> qkv_proj -> q [T, Hq, D], k/v [T, Hkv, D]
      -> RoPE(q, k at positions)
      -> backend.store(plan, k, v, k_cache[l], v_cache[l])     new K/V into pages
      -> backend.attend(plan, q, k_cache[l], v_cache[l])       cached + new context

``backend`` is the attention backend chosen once (radixray.kernels.make_backend; the model runner
builds it at start-up) and ``plan`` the step's metadata it prepared once for all layers.
      -> o_proj -> + residual -> RMSNorm -> SwiGLU MLP -> + residual

Weights are named as in HF transformers' ``LlamaForCausalLM`` at the boundary
(:meth:`LlamaModel.load_hf_state_dict` / :meth:`LlamaModel.hf_state_dict`); inside, q/k/v and
gate/up are fused so each is one matmul (on CPU, fewer and larger GEMMs are markedly faster),
and on CPU in float32 the loaders pre-pack every linear's weight for oneDNN (see linear.py).
RoPE is the non-interleaved (rotate-half) convention of HF checkpoints; GGUF loaders undo
llama.cpp's q/k permutation before the weights get here.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from radixray.kernels import AttentionBackend, make_backend
from radixray.model_meta.model_config import ModelConfig

from .attention import AttentionMetadata
from .linear import Linear

__all__ = ["LlamaModel"]


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, device=None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(size, device=device), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            # the same formula in one fused op (one pass over x instead of six small ops)
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # Normalise in float32 whatever the dtype, then scale in the model dtype (as HF does).
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for every position up to ``max_position_embeddings``, non-interleaved."""

    def __init__(self, head_dim: int, theta: float, max_positions: int, device=None) -> None:
        super().__init__()
        # float64 for the angles: position * frequency loses ~1e-3 rad in float32 at 8k positions.
        inv_freq = 1.0 / (
            theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)
        )
        angles = torch.arange(max_positions, dtype=torch.float64, device=device)[:, None] * inv_freq
        self.register_buffer("cos", angles.cos().float(), persistent=False)  # [max_pos, D/2]
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin ``[T, 1, D/2]`` (float32) for ``positions [T]`` (must be < max_positions)."""
        return self.cos[positions][:, None, :], self.sin[positions][:, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on ``x [T, H, D]``: pairs are (i, i + D/2), computed in float32."""
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, device=None) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        self.q_size, self.kv_size = cfg.q_size, cfg.kv_size
        self.scale = cfg.head_dim**-0.5
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, device)
        self.o_proj = Linear(self.q_size, cfg.hidden_size, device)

    def forward(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        backend: AttentionBackend,
        plan,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        T = h.shape[0]
        q, k, v = self.qkv_proj(h).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = apply_rope(q.view(T, self.num_heads, self.head_dim), cos, sin)
        k = apply_rope(k.view(T, self.num_kv_heads, self.head_dim), cos, sin)
        v = v.view(T, self.num_kv_heads, self.head_dim)
        backend.store(plan, k, v, k_cache, v_cache)
        out = backend.attend(plan, q, k_cache, v_cache, self.scale)
        return self.o_proj(out.reshape(T, self.q_size))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, device=None) -> None:
        super().__init__()
        self.intermediate_size = cfg.intermediate_size
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, device)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, device)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(h).split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, device=None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, device)
        self.self_attn = Attention(cfg, device)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, device)
        self.mlp = MLP(cfg, device)

    def forward(self, h, cos, sin, backend, plan, k_cache, v_cache) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, backend, plan, k_cache, v_cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    """The decoder and its LM head. Build with a loader (:func:`~.loader.load_model`), or
    construct (weights start on the meta device) and call :meth:`load_hf_state_dict`.
    """

    def __init__(
        self,
        config: ModelConfig,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.config = config
        self.device = torch.device(device)
        self.dtype = dtype
        meta = torch.device("meta")  # weights arrive from a state dict; no init work, no memory
        # An Embedding given its weight skips its random init: normal_ on a meta tensor imports
        # torch's meta registrations (~900 modules, ~4 s of every worker's start).
        self.embed_tokens = nn.Embedding(
            config.vocab_size,
            config.hidden_size,
            _weight=torch.empty(config.vocab_size, config.hidden_size, device=meta),
        )
        self.layers = nn.ModuleList(DecoderLayer(config, meta) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, meta)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, meta)
        self.rope = RotaryEmbedding(
            config.head_dim, config.rope_theta, config.max_position_embeddings, self.device
        )
        self.attention: AttentionBackend | None = None  # built for the first pool it meets
        self._attention_name: str | None = None

    def set_attention_backend(self, backend: AttentionBackend | str | None) -> None:
        """Run every layer's attention on ``backend``: an object from
        :func:`radixray.kernels.make_backend` (what the model runner passes), or a name
        ("flash_attn", "triton", "cpu", "torch"; None: RADIXRAY_ATTENTION_BACKEND, else the best
        available) built for the first pool the model runs on."""
        if isinstance(backend, AttentionBackend):
            self.attention, self._attention_name = backend, backend.name
        else:
            self.attention, self._attention_name = None, backend

    def _attention_for(self, k_cache: torch.Tensor) -> AttentionBackend:
        """The backend for this pool (``k_cache [layers, pages, P, Hkv, D]``); built once, and
        again only if the model is later run on a pool of another kind."""
        backend, P = self.attention, k_cache.shape[2]
        if (
            backend is None
            or backend.page_size != P
            or backend.dtype != k_cache.dtype
            or backend.device != k_cache.device
        ):
            backend = make_backend(
                self._attention_name, k_cache.device, k_cache.dtype, P, self.config.head_dim
            )
            self.attention = backend
        return backend

    # --- forward ------------------------------------------------------------------------------

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionMetadata,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        logits_indices: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One step over ``T`` new tokens; returns float32 logits ``[len(logits_indices), vocab]``.

        - ``input_ids``, ``positions``: int64 ``[T]`` (positions < max_position_embeddings);
        - ``attn``: where K/V go and which pages each sequence reads (:class:`AttentionMetadata`);
        - ``k_cache``, ``v_cache``: the pool, ``[num_layers, num_pages, page_size, Hkv, D]`` in the
          model's dtype, written in place at ``attn.slot_mapping``;
        - ``logits_indices``: rows that need logits; ``None`` = each sequence's last new token.
        """
        cfg = self.config
        expect = (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
        for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
            if cache.dim() != 5 or (cache.shape[0], *cache.shape[3:]) != expect:
                raise ValueError(
                    f"{name} must be [num_layers={expect[0]}, num_pages, page_size, "
                    f"num_kv_heads={expect[1]}, head_dim={expect[2]}], got {tuple(cache.shape)}"
                )
        if input_ids.shape != positions.shape or input_ids.dim() != 1:
            raise ValueError(
                f"input_ids and positions must both be [T], got {tuple(input_ids.shape)} and "
                f"{tuple(positions.shape)}"
            )
        h = self.embed_tokens(input_ids)
        cos, sin = self.rope(positions)
        # Where the batch's tokens sit in the pool is the same for every layer: the backend
        # works it out once per step.
        backend = self._attention_for(k_cache)
        plan = backend.prepare(
            attn.slot_mapping, attn.block_table, attn.cu_seqlens_q, attn.seq_lens, attn.max_seqlen_q
        )
        for i, layer in enumerate(self.layers):
            h = layer(h, cos, sin, backend, plan, k_cache[i], v_cache[i])
        if logits_indices is None:
            logits_indices = attn.last_token_indices()
        h = self.norm(h[logits_indices])
        return self.lm_head(h).float()

    # --- weights ------------------------------------------------------------------------------

    def load_hf_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Take weights named as in HF ``LlamaForCausalLM`` (``model.layers.0.self_attn.q_proj
        .weight``, ...; rotate-half q/k layout). Copies to this model's device and dtype; every
        weight must be present (``lm_head.weight`` only when embeddings are untied)."""
        cfg = self.config
        missing = [k for k in _hf_names(cfg) if k not in state]
        if missing:
            raise KeyError(f"state dict lacks {len(missing)} weights, e.g. {missing[:4]}")

        def get(name: str, shape: tuple[int, ...]) -> torch.Tensor:
            w = state[name]
            if tuple(w.shape) != shape:
                raise ValueError(f"{name}: expected shape {shape}, got {tuple(w.shape)}")
            return w.to(self.device, self.dtype)

        def param(t: torch.Tensor) -> nn.Parameter:
            return nn.Parameter(t.contiguous(), requires_grad=False)

        H, V, I = cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size  # noqa: E741
        self.embed_tokens.weight = param(get("model.embed_tokens.weight", (V, H)))
        self.norm.weight = param(get("model.norm.weight", (H,)))
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        else:
            self.lm_head.weight = param(get("lm_head.weight", (V, H)))
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            layer.input_layernorm.weight = param(get(p + "input_layernorm.weight", (H,)))
            layer.post_attention_layernorm.weight = param(
                get(p + "post_attention_layernorm.weight", (H,))
            )
            a = p + "self_attn."
            layer.self_attn.qkv_proj.weight = param(
                torch.cat(
                    [
                        get(a + "q_proj.weight", (cfg.q_size, H)),
                        get(a + "k_proj.weight", (cfg.kv_size, H)),
                        get(a + "v_proj.weight", (cfg.kv_size, H)),
                    ]
                )
            )
            layer.self_attn.o_proj.weight = param(get(a + "o_proj.weight", (H, cfg.q_size)))
            m = p + "mlp."
            layer.mlp.gate_up_proj.weight = param(
                torch.cat([get(m + "gate_proj.weight", (I, H)), get(m + "up_proj.weight", (I, H))])
            )
            layer.mlp.down_proj.weight = param(get(m + "down_proj.weight", (H, I)))

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights under HF ``LlamaForCausalLM`` names (unfused; views of this model's
        weights, or exact copies where a linear is packed), e.g. to build an independent
        transformers reference from the same weights."""
        cfg = self.config
        out = {
            "model.embed_tokens.weight": self.embed_tokens.weight,
            "model.norm.weight": self.norm.weight,
            "lm_head.weight": self.lm_head.dense_weight(),
        }
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            out[p + "input_layernorm.weight"] = layer.input_layernorm.weight
            out[p + "post_attention_layernorm.weight"] = layer.post_attention_layernorm.weight
            q, k, v = layer.self_attn.qkv_proj.dense_weight().split(
                [cfg.q_size, cfg.kv_size, cfg.kv_size]
            )
            out[p + "self_attn.q_proj.weight"] = q
            out[p + "self_attn.k_proj.weight"] = k
            out[p + "self_attn.v_proj.weight"] = v
            out[p + "self_attn.o_proj.weight"] = layer.self_attn.o_proj.dense_weight()
            gate, up = layer.mlp.gate_up_proj.dense_weight().split(cfg.intermediate_size)
            out[p + "mlp.gate_proj.weight"] = gate
            out[p + "mlp.up_proj.weight"] = up
            out[p + "mlp.down_proj.weight"] = layer.mlp.down_proj.dense_weight()
        return {k: v.detach() for k, v in out.items()}


def _hf_names(cfg: ModelConfig) -> list[str]:
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not cfg.tie_word_embeddings:
        names.append("lm_head.weight")
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
        names += [p + f"self_attn.{n}_proj.weight" for n in "qkvo"]
        names += [p + f"mlp.{n}_proj.weight" for n in ("gate", "up", "down")]
    return names
