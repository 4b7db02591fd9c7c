"""The decoder family (Llama, Mistral, Qwen2/2.5, Qwen3, Qwen3-MoE: RMSNorm, RoPE, GQA, SwiGLU or
a sparse MoE) that runs one flat varlen batch per step against the paged KV pool. The members
differ only in ModelConfig's flags (docs/models.md): q/k/v biases, per-head q/k norms, MoE.
Hybrids (LFM2, Granite 4.0-H) put a recurrent-state mixer in place of attention in some layers
(state_layers.py): those layers read and write the state pool at the step's slots
(``state``: state_metadata.py), not KV; the KV pool holds the attention layers only.

Per layer and step::

    h [T, hidden] -> RMSNorm -> qkv_proj -> q [T, Hq, D], k/v [T, Hkv, D]
      -> [q_norm, k_norm per head]  (qk_norm)
      -> RoPE(q, k at positions)
      -> backend.store(plan, k, v, k_cache[l], v_cache[l])     new K/V into pages
         (norms, RoPE and store: one kernel where fused, ``Attention.fused_rope``)
      -> backend.attend(plan, q, k_cache[l], v_cache[l])       cached + new context

``backend`` is the attention backend chosen once (radixray.kernels.make_backend; the model runner
builds it at start-up) and ``plan`` the step's metadata it prepared once for all layers.
      -> o_proj -> + residual -> RMSNorm -> SwiGLU MLP (or SparseMoE, moe.py) -> + residual

Weights are named as in HF transformers' ``*ForCausalLM`` at the boundary (hf_weights.py:
:meth:`LlamaModel.load_hf_state_dict` / :meth:`LlamaModel.hf_state_dict`); inside, q/k/v and
gate/up are fused so each is one matmul (on CPU, fewer and larger GEMMs are markedly faster),
and on CPU in float32 the loaders pre-pack every linear's weight for oneDNN (see linear.py).
RoPE is the non-interleaved (rotate-half) convention of HF checkpoints; GGUF loaders undo
llama.cpp's q/k permutation before the weights get here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from radixray.kernels import AttentionBackend, make_backend
from radixray.model_meta.model_config import ModelConfig

from .attention import AttentionMetadata, WindowKV
from .hf_weights import export_hf_weights, load_hf_weights
from .hybrid_weights import HYBRID_ARCHITECTURES, export_hybrid_weights, load_hybrid_weights
from .layers import MLP, RMSNorm, RotaryEmbedding, apply_rope
from .linear import Linear
from .moe import SparseMoE
from .state_layers import state_mixer
from .state_metadata import StateBatch
from .window import windowed_attention

__all__ = ["LlamaModel"]


@dataclass(frozen=True)
class Step:
    """What every layer of one forward step shares: the backend and its plan, the step's
    metadata (for window layers), its positions and the model's RoPE tables per (theta, factor).
    :meth:`rope` gathers a table's rows at the positions on first use (a layer whose RoPE is
    fused, worker/fused.py, reads the whole table by position instead: no per-step gather)."""

    backend: AttentionBackend
    plan: object
    attn: AttentionMetadata
    positions: torch.Tensor
    ropes: dict[tuple[float, float], RotaryEmbedding]
    _rows: dict = field(default_factory=dict)  # (theta, factor) -> (cos, sin) at the positions

    def rope(self, key: tuple[float, float]) -> tuple[torch.Tensor, torch.Tensor]:
        if key not in self._rows:
            self._rows[key] = self.ropes[key](self.positions)
        return self._rows[key]


class Attention(nn.Module):
    """GQA self-attention; ``qkv_bias`` adds biases to q/k/v (Qwen2), ``qk_norm`` an RMSNorm over
    each head of q and k before RoPE (Qwen3, Gemma 3); a window layer attends to its last
    ``window`` positions only (the attention backend's ``window``); without ``use_rope`` (NoPE)
    q and k are not rotated."""

    def __init__(self, cfg: ModelConfig, index: int, device=None) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        self.q_size, self.kv_size = cfg.q_size, cfg.kv_size
        self.scale = cfg.attn_scale if cfg.attn_scale is not None else cfg.head_dim**-0.5
        self.window = cfg.window(index)
        self.rope = cfg.rope(index) if cfg.use_rope else None
        self.softcap = cfg.attn_logit_softcap
        self.qkv_proj = Linear(
            cfg.hidden_size, self.q_size + 2 * self.kv_size, device, bias=cfg.qkv_bias
        )
        self.o_proj = Linear(self.q_size, cfg.hidden_size, device)
        self.q_norm = self.k_norm = None
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, device, cfg.norm_offset)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, device, cfg.norm_offset)
        # worker/fused.py's RopeStore once the model runner has checked it (a 16-bit model on
        # CUDA, the Triton backend's pool): q/k norms, RoPE and the K/V store in one kernel
        self.fused_rope = None

    def forward(
        self, h: torch.Tensor, step: Step, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> torch.Tensor:
        T = h.shape[0]
        qkv = self.qkv_proj(h)
        if self.fused_rope is not None and step.backend.name == "triton":  # its pool layout
            q = self.fused_rope(qkv, step, k_cache, v_cache)
        else:
            q = self._rope_store(qkv, step, k_cache, v_cache)
        if self.softcap is None:  # every backend takes the layer's window (None: full)
            out = step.backend.attend(step.plan, q, k_cache, v_cache, self.scale, self.window)
        else:  # soft-capped scores (Gemma 2), which the kernels do not do: window.py
            out = windowed_attention(
                q, k_cache, v_cache, step.attn, self.scale, self.window, self.softcap
            )
        return self.o_proj(out.reshape(T, self.q_size))

    def _rope_store(self, qkv, step: Step, k_cache, v_cache) -> torch.Tensor:
        """PyTorch's path: q/k norms, RoPE, then the backend's store; returns q."""
        T, Hq, Hkv, D = qkv.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        cos, sin = step.rope(self.rope) if self.rope is not None else (None, None)
        if self.q_norm is None and cos is not None:  # q and k rotated together: one set of kernels
            qk = qkv[:, : self.q_size + self.kv_size].view(T, Hq + Hkv, D)
            qk = apply_rope(qk, cos, sin)
            q, k = qk[:, :Hq], qk[:, Hq:]
        else:
            q = qkv[:, : self.q_size].view(T, Hq, D)
            k = qkv[:, self.q_size : self.q_size + self.kv_size].view(T, Hkv, D)
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            if cos is not None:
                q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        v = qkv[:, self.q_size + self.kv_size :].view(T, Hkv, D)
        step.backend.store(step.plan, k, v, k_cache, v_cache)
        return q


class DecoderLayer(nn.Module):
    """Pre-norm residual blocks; with ``sandwich_norms`` (Gemma) the attention's and the MLP's
    outputs are normed too, and the MLP's input has its own norm (HF's names kept: there
    ``post_attention_layernorm`` norms the attention's output, not the MLP's input). A state
    layer has ``mixer`` (state_layers.py) in place of ``self_attn``; with a
    ``residual_multiplier`` (Granite) each block's output is scaled before its residual add
    (no family has both a multiplier and sandwich norms; the multiplier's path has none).
    The MLP's residual add is left to the next layer: ``forward`` takes and returns ``(h,
    pending)``, the hidden state being ``h + pending``, and adds them in its input norm's
    kernel (``RMSNorm.add``; the model adds the last layer's before its final norm)."""

    def __init__(self, cfg: ModelConfig, index: int, device=None) -> None:
        super().__init__()

        def norm() -> RMSNorm:
            return RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, device, cfg.norm_offset)

        self.sandwich = cfg.sandwich_norms
        self.input_layernorm = norm()
        self.mixer = state_mixer(cfg, index, device)
        self.self_attn = Attention(cfg, index, device) if self.mixer is None else None
        self.scale = cfg.residual_multiplier
        self.post_attention_layernorm = norm()
        if self.sandwich:
            self.pre_feedforward_layernorm = norm()
            self.post_feedforward_layernorm = norm()
        self.mlp = (
            SparseMoE(cfg, device)
            if cfg.is_moe_layer(index)
            else MLP(cfg.hidden_size, cfg.intermediate_size, device, cfg.hidden_act)
        )

    def forward(self, h, step: Step, k_cache, v_cache, state=None, pending=None):
        if pending is None:
            x = self.input_layernorm(h)
        else:  # pending + h: the sum as h + pending (IEEE addition commutes)
            h, x = self.input_layernorm.add(pending, h)
        a = (
            self.self_attn(x, step, k_cache, v_cache)
            if self.mixer is None
            else self.mixer(x, state)
        )
        if self.scale != 1.0:
            h, normed = self.post_attention_layernorm.add(h, a * self.scale)
            return h, self.mlp(normed) * self.scale
        if not self.sandwich:
            h, normed = self.post_attention_layernorm.add(h, a)
            return h, self.mlp(normed)
        h = h + self.post_attention_layernorm(a)
        return h, self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))


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
        self.layers = nn.ModuleList(DecoderLayer(config, i, meta) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, meta, config.norm_offset)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, meta)
        # one table per distinct (theta, factor): Gemma 3's local and global layers differ
        ropes = sorted({config.rope(i) for i in config.attention_layers}) if config.use_rope else []
        self._rope_keys = ropes
        self.ropes = nn.ModuleList(
            RotaryEmbedding(
                config.head_dim,
                theta,
                config.max_position_embeddings,
                self.device,
                factor,
                config.rope_freq_factors,
            )
            for theta, factor in ropes
        )
        # where each layer's KV lives without a window pool: (False, index in the pool), or
        # (None, None) for a state layer, which has none
        kv = {layer: j for j, layer in enumerate(config.attention_layers)}
        self._kv_slots = [(False, kv[i]) if i in kv else (None, None) for i in self.idx]
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
        window: WindowKV | None = None,
        before_layer: Callable[[int], None] | None = None,
        state: StateBatch | None = None,
    ) -> torch.Tensor:
        """One step over ``T`` new tokens; returns float32 logits ``[len(logits_indices), vocab]``.

        - ``input_ids``, ``positions``: int64 ``[T]`` (positions < max_position_embeddings);
        - ``attn``: where K/V go and which pages each sequence reads (:class:`AttentionMetadata`);
        - ``k_cache``, ``v_cache``: the pool, ``[kv layers, num_pages, page_size, Hkv, D]`` in the
          model's dtype, written in place at ``attn.slot_mapping``; its layers are the
          attention layers (``config.attention_layers``: every layer but a hybrid's state ones);
        - ``logits_indices``: rows that need logits; ``None`` = each sequence's last new token;
        - ``window``: the sliding-window layers' own pool and metadata; then ``k_cache`` and
          ``v_cache`` hold the other layers only, in order (docs/window_cache.md);
        - ``before_layer``: called with ``i`` just before layer ``i`` reads or writes its KV (the
          host tier's copies of that layer's pages, worker/host_copies.py); not for state layers;
        - ``state``: a hybrid's state pool and each sequence's slot (state_metadata.py), in the
          batch's sequence order; required when the model has state layers, which read and
          write their state there in place.
        """
        cfg = self.config
        slots = window.layer_slots if window is not None else self._kv_slots
        n_win = sum(w for w, _ in slots if w is not None)
        self._check_pool(k_cache, v_cache, len(cfg.attention_layers) - n_win, "")
        if window is not None:
            self._check_pool(window.k_cache, window.v_cache, n_win, "window ")
        if input_ids.shape != positions.shape or input_ids.dim() != 1:
            raise ValueError(
                f"input_ids and positions must both be [T], got {tuple(input_ids.shape)} and "
                f"{tuple(positions.shape)}"
            )
        if state is None and cfg.state_layers:
            raise ValueError(
                f"{cfg.architecture}: layers {list(cfg.state_layers)} keep a recurrent state; "
                "forward needs state=StateBatch(meta, pool)"
            )
        h = self.embed_tokens(input_ids)
        if cfg.embed_scale != 1.0:
            h = h * torch.tensor(cfg.embed_scale, dtype=h.dtype)
        steps, pools = self._steps(attn, positions, k_cache, v_cache, window)
        pending = None  # the last MLP's output, added in the next layer's input norm
        for i, (layer, (in_window, s)) in enumerate(zip(self.layers, slots, strict=True)):
            if in_window is None:  # a state layer: no KV
                h, pending = layer(h, None, None, None, state, pending)
                continue
            if before_layer is not None:
                before_layer(i)
            k, v = pools[in_window]
            h, pending = layer(h, steps[in_window], k[s], v[s], None, pending)
        h = h + pending
        if logits_indices is None:
            logits_indices = attn.last_token_indices()
        return self._logits(h[logits_indices])

    def _steps(self, attn, positions, k_cache, v_cache, window) -> tuple[list[Step], list]:
        """The step's shared state per pool (the main one, and the window layers' if any):
        the backend's plan, prepared once for all layers, the positions and the RoPE tables."""
        # Where the batch's tokens sit in the pool is the same for every layer: the backend
        # works it out once per step.
        backend = self._attention_for(k_cache)
        plan = backend.prepare(
            attn.slot_mapping, attn.block_table, attn.cu_seqlens_q, attn.seq_lens, attn.max_seqlen_q
        )
        ropes, rows = dict(zip(self._rope_keys, self.ropes, strict=True)), {}
        steps = [Step(backend, plan, attn, positions, ropes, rows)]
        pools = [(k_cache, v_cache)]
        if window is not None:  # the window layers read their own pool's pages
            w = window.attn
            wplan = backend.prepare(
                w.slot_mapping, w.block_table, w.cu_seqlens_q, w.seq_lens, w.max_seqlen_q
            )
            steps.append(Step(backend, wplan, w, positions, ropes, rows))
            pools.append((window.k_cache, window.v_cache))
        return steps, pools

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm, LM head, then Granite's scaling or Gemma's soft cap: float32 logits."""
        cfg = self.config
        logits = self.lm_head(self.norm(h))
        if cfg.logits_scaling != 1.0:
            logits = logits / cfg.logits_scaling
        logits = logits.float()
        if cfg.final_logit_softcap is not None:
            cap = cfg.final_logit_softcap
            logits = torch.tanh(logits / cap) * cap
        return logits

    @property
    def idx(self) -> range:
        return range(self.config.num_layers)

    def _check_pool(self, k_cache, v_cache, layers: int, what: str) -> None:
        cfg = self.config
        expect = (layers, cfg.num_kv_heads, cfg.head_dim)
        for name, cache in ((f"{what}k_cache", k_cache), (f"{what}v_cache", v_cache)):
            if cache.dim() != 5 or (cache.shape[0], *cache.shape[3:]) != expect:
                raise ValueError(
                    f"{name} must be [num_layers={expect[0]}, num_pages, page_size, "
                    f"num_kv_heads={expect[1]}, head_dim={expect[2]}], got {tuple(cache.shape)}"
                )

    # --- weights ------------------------------------------------------------------------------

    def load_hf_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Take weights named as in HF ``*ForCausalLM`` checkpoints of the config's architecture
        (``model.layers.0.self_attn.q_proj.weight``, ...; rotate-half q/k layout; see
        hf_weights.py; the hybrids' names: hybrid_weights.py). Copies to this model's device and
        dtype; every weight must be present (``lm_head.weight`` only when embeddings are untied)."""
        if self.config.architecture in HYBRID_ARCHITECTURES:
            load_hybrid_weights(self, state)
        else:
            load_hf_weights(self, state)

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights under HF names (unfused; views of this model's weights, or exact copies
        where a linear is packed), e.g. to build an independent transformers reference."""
        if self.config.architecture in HYBRID_ARCHITECTURES:
            return export_hybrid_weights(self)
        return export_hf_weights(self)
