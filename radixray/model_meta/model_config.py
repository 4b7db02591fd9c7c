"""Model hyperparameters: one frozen dataclass, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ModelConfig", "tiny_config"]


@dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters of a Llama-family decoder (RMSNorm, RoPE, GQA, SwiGLU).

    ``head_dim`` is explicit because some checkpoints use ``num_heads * head_dim != hidden_size``.
    Token ids are ``None`` when the checkpoint does not name one.
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
