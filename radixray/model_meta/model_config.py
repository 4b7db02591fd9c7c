"""Model hyperparameters: one frozen dataclass, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

from .state_layers import LAYER_KINDS, Mamba2Spec, ShortConvSpec

__all__ = ["ModelConfig", "UnsupportedModelError", "tiny_config"]


class UnsupportedModelError(ValueError, NotImplementedError):
    """A checkpoint this worker cannot run (an architecture or a setting it lacks). A ValueError,
    so that ``radixray worker`` refuses it at start with exit code 2 and the message, no
    traceback; a NotImplementedError for callers that caught that before."""


@dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters of a decoder of the Llama family (RMSNorm, RoPE, GQA, SwiGLU) and the
    flags that tell its members apart (docs/models.md):

    - ``architecture``: the HF ``model_type`` it was read from (llama, mistral, qwen2, ...);
    - ``qkv_bias``: the q, k and v projections have biases (Qwen2);
    - ``qk_norm``: an RMSNorm over each head of q and of k, before RoPE (Qwen3);
    - ``num_experts`` > 0: a sparse mixture of experts (Qwen3-MoE) in every layer but
      ``dense_layers``: ``num_experts_per_tok`` experts of width ``moe_intermediate_size`` per
      token, their softmax weights renormalised to sum 1 when ``norm_topk_prob``;
    - Gemma 3's differences: ``norm_offset`` (every RMSNorm scales by ``offset + w``: Gemma's
      ``1 + w``), ``sandwich_norms`` (a norm on the attention's output and around the MLP too),
      ``hidden_act`` (``gelu_tanh``: GeGLU), ``embed_scale`` (embeddings times ``sqrt(hidden)``),
      ``attn_scale`` (the softmax scale; None: ``head_dim ** -0.5``), ``final_logit_softcap``,
      ``attn_logit_softcap`` (Gemma 2: ``tanh`` soft-capping of the attention scores);
    - ``layer_windows``: per layer, the window of a sliding-window layer (a query at position
      ``p`` sees keys ``p - W < k <= p``) or None (all); ``layer_rope``: per layer, RoPE's
      ``(theta, linear scaling factor)``. Empty: every layer full, ``(rope_theta, 1.0)``;
    - ``rope_freq_factors``: ``head_dim // 2`` divisors of RoPE's inverse frequencies for every
      layer (Llama 3.1's ``llama3`` scaling, linear scaling, a GGUF's ``rope_freqs``); empty: none;
    - hybrids (state_layers.py): ``layer_kinds`` per layer ``"attention"``, ``"conv"`` (LFM2's
      short convolution, ``short_conv``) or ``"mamba"`` (Mamba2, ``mamba``); empty: all
      attention. Only attention layers have KV (the pool holds them alone, in order);
    - Granite's: ``use_rope`` False (NoPE), ``residual_multiplier`` (each block's output times
      it before the residual add), ``logits_scaling`` (logits divided by it),
      ``moe_shared_mlp`` (MoE layers add the dense MLP's output to the experts').

    ``head_dim`` is explicit because some checkpoints use ``num_heads * head_dim != hidden_size``.
    Token ids are ``None`` when the checkpoint does not name one; ``eos_token_id`` is the first
    end-of-sequence id and ``stop_token_ids`` all of them (a checkpoint may declare several).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    name: str = "llama"
    architecture: str = "llama"
    qkv_bias: bool = False
    qk_norm: bool = False
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    dense_layers: tuple[int, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    norm_offset: float = 0.0
    sandwich_norms: bool = False
    hidden_act: str = "silu"
    embed_scale: float = 1.0
    attn_scale: float | None = None
    final_logit_softcap: float | None = None
    attn_logit_softcap: float | None = None
    layer_windows: tuple[int | None, ...] = ()
    layer_rope: tuple[tuple[float, float], ...] = ()
    rope_freq_factors: tuple[float, ...] = ()
    layer_kinds: tuple[str, ...] = ()
    short_conv: ShortConvSpec | None = None
    mamba: Mamba2Spec | None = None
    use_rope: bool = True
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0
    moe_shared_mlp: bool = False

    def __post_init__(self) -> None:
        for field in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{field} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads}) for grouped-query attention"
            )
        if self.head_dim % 2 != 0:
            raise ValueError(f"ModelConfig.head_dim must be even for RoPE, got {self.head_dim}")
        if not self.rope_theta > 0:
            raise ValueError(f"ModelConfig.rope_theta must be > 0, got {self.rope_theta!r}")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"ModelConfig.rms_norm_eps must be > 0, got {self.rms_norm_eps!r}")
        for field in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(self, field)
            if value is not None and not (0 <= value < self.vocab_size):
                raise ValueError(
                    f"ModelConfig.{field} must be None or in [0, {self.vocab_size}), got {value!r}"
                )

        if self.num_experts:
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise ValueError(
                    f"ModelConfig.num_experts_per_tok must be in [1, num_experts="
                    f"{self.num_experts}], got {self.num_experts_per_tok!r}"
                )
            if self.moe_intermediate_size <= 0:
                raise ValueError("ModelConfig.moe_intermediate_size must be > 0 in an MoE model")
        for field in ("layer_windows", "layer_rope", "layer_kinds"):
            value = getattr(self, field)
            if value and len(value) != self.num_layers:
                raise ValueError(
                    f"ModelConfig.{field} needs one entry per layer ({self.num_layers}), got "
                    f"{len(value)}"
                )
        if self.rope_freq_factors and len(self.rope_freq_factors) != self.head_dim // 2:
            raise ValueError(
                f"ModelConfig.rope_freq_factors needs head_dim // 2 = {self.head_dim // 2} "
                f"entries, got {len(self.rope_freq_factors)}"
            )
        if any(w is not None and w < 1 for w in self.layer_windows):
            raise ValueError(f"ModelConfig.layer_windows must be >= 1, got {self.layer_windows}")
        if self.hidden_act not in ("silu", "gelu_tanh"):
            raise ValueError(
                f"ModelConfig.hidden_act must be silu or gelu_tanh, got {self.hidden_act!r}"
            )
        for value in self.stop_token_ids:
            if not 0 <= value < self.vocab_size:
                raise ValueError(f"ModelConfig.stop_token_ids: {value!r} not in the vocabulary")
        self._check_state_layers()

    def _check_state_layers(self) -> None:
        """Every kind known and described; no window layers beside state layers."""
        bad = sorted(set(self.layer_kinds) - set(LAYER_KINDS))
        if bad:
            raise ValueError(f"ModelConfig.layer_kinds: unknown {bad}; valid: {LAYER_KINDS}")
        for kind, spec in (("conv", self.short_conv), ("mamba", self.mamba)):
            if kind in self.layer_kinds and spec is None:
                raise ValueError(f"ModelConfig: {kind!r} layers need ModelConfig.{kind} specs")
        if not self.logits_scaling > 0:
            raise ValueError(f"ModelConfig.logits_scaling must be > 0, got {self.logits_scaling}")
        windows = [i for i, w in enumerate(self.layer_windows) if w is not None]
        if windows and self.state_layers:
            # the window cache (swa_radix) and the state cache keep different things per node
            # and do not compose yet: refused rather than served with one of them wrong
            raise UnsupportedModelError(
                f"sliding-window layers {windows} together with recurrent-state layers "
                f"{list(self.state_layers)} are not supported: the window cache and the state "
                "cache do not compose"
            )

    def is_moe_layer(self, layer: int) -> bool:
        """Whether layer ``layer`` has the sparse MoE block (else the dense MLP)."""
        return self.num_experts > 0 and layer not in self.dense_layers

    def window(self, layer: int) -> int | None:
        """Layer ``layer``'s sliding window in tokens, or None when it attends to everything."""
        return self.layer_windows[layer] if self.layer_windows else None

    def rope(self, layer: int) -> tuple[float, float]:
        """Layer ``layer``'s RoPE ``(theta, linear scaling factor)``."""
        return self.layer_rope[layer] if self.layer_rope else (self.rope_theta, 1.0)

    def layer_kind(self, layer: int) -> str:
        """Layer ``layer``'s mixer: ``"attention"``, ``"conv"`` or ``"mamba"``."""
        return self.layer_kinds[layer] if self.layer_kinds else "attention"

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """The layers with KV, in order: the KV pool's layer ``j`` is model layer
        ``attention_layers[j]``."""
        return tuple(i for i in range(self.num_layers) if self.layer_kind(i) == "attention")

    @property
    def state_layers(self) -> tuple[int, ...]:
        """The layers with a recurrent state instead of KV, in order."""
        return tuple(i for i in range(self.num_layers) if self.layer_kind(i) != "attention")

    @property
    def q_size(self) -> int:
        """Width of the query projection: ``num_heads * head_dim``."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of each of the key and value projections: ``num_kv_heads * head_dim``."""
        return self.num_kv_heads * self.head_dim


def tiny_config(tie_word_embeddings: bool = False) -> ModelConfig:
    """A random tiny Llama for tests: fast on CPU, still GQA (4 query heads over 2 KV heads).

    The vocabulary (320) covers :class:`~radixray.model_meta.byte_tokenizer.ByteTokenizer`'s
    259 ids, so text prompts work end to end.
    """
    from .byte_tokenizer import ByteTokenizer

    return ModelConfig(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        max_position_embeddings=4096,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=ByteTokenizer.BOS_ID,
        eos_token_id=ByteTokenizer.EOS_ID,
        pad_token_id=ByteTokenizer.EOS_ID,
        name="tiny",
    )
