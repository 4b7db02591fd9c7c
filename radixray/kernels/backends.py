"""Attention backends as objects: chosen once at start-up, metadata prepared once per step.

The shape vLLM's and mini-sglang's attention backends have. A backend is built for one pool
(device, dtype, page size, head size) by :func:`make_backend`, which checks that it can run there
and otherwise fails with the reason and the valid names. Per step the model calls
:meth:`AttentionBackend.prepare` once with the step's paged metadata; every layer then calls
:meth:`~AttentionBackend.store` and :meth:`~AttentionBackend.attend` with that plan. Nothing on
the per-layer path reads the environment, imports or re-resolves anything.

==============  =====================================================================  ========
name            what runs                                                              where
==============  =====================================================================  ========
``flash_attn``  vLLM's flash-attn fork / flash-attn ``block_table`` path; Triton store   CUDA
``triton``      our kernels (split-KV decode for pure decode steps, extend, store)     CUDA
``cpu``         cpu.py: one gather plan per step, torch's fused attention              CPU f32
``torch``       reference.py, the spec (float32 math, any device)                      anywhere
==============  =====================================================================  ========

The automatic choice (no name, or "auto") is the first that can run, in that order; on CPU Triton
runs only in its interpreter, which is for tests, so it is never chosen automatically there.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass
from typing import ClassVar

import torch

from . import cpu, flash_attn, reference
from ._validate import check_window

__all__ = [
    "BACKENDS",
    "ENV_VAR",
    "AttentionBackend",
    "BackendUnavailableError",
    "PagedStep",
    "available_names",
    "backend_class",
    "make_backend",
]

ENV_VAR = "RADIXRAY_ATTENTION_BACKEND"
_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class BackendUnavailableError(RuntimeError):
    """A backend was asked for by name and cannot run here."""


@dataclass(frozen=True)
class PagedStep:
    """One step's paged metadata as the GPU and reference backends read it (shapes as in
    ``radixray.worker.model.attention.AttentionMetadata``)."""

    slot_mapping: torch.Tensor  # int [T], page * P + offset; -1 = do not store
    block_table: torch.Tensor  # int32 [B, max_pages]
    cu_seqlens_q: torch.Tensor  # int32 [B + 1]
    seq_lens: torch.Tensor  # int32 [B], cached + new
    max_seqlen_q: int | None  # a host int (never read from a device tensor); None = unknown
    decode_only: bool  # every sequence has exactly one new token

    def extend(self, fn, q, k_cache, v_cache, scale: float, window=None) -> torch.Tensor:
        """``fn``, an extend kernel with the signature of reference.extend_attention plus
        ``max_seqlen_q``, over this step."""
        args = (self.block_table, self.cu_seqlens_q, self.seq_lens, scale)
        return fn(q, k_cache, v_cache, *args, max_seqlen_q=self.max_seqlen_q, window=window)


class AttentionBackend:
    """Paged attention for one pool. Subclasses set ``name`` and implement ``unavailable``,
    ``store`` and ``attend``; ``prepare`` builds the plan every layer of a step shares."""

    name: ClassVar[str]

    def __init__(self, device: torch.device, dtype: torch.dtype, page_size: int, head_dim: int):
        self.device, self.dtype = torch.device(device), dtype
        self.page_size, self.head_dim = page_size, head_dim

    @classmethod
    def unavailable(
        cls, device: torch.device, dtype: torch.dtype, page_size: int, head_dim: int
    ) -> str | None:
        """None when this backend can run a pool like this, else why not."""
        raise NotImplementedError

    def prepare(self, slot_mapping, block_table, cu_seqlens_q, seq_lens, max_seqlen_q=None):
        """The plan for one step, read by every layer's ``store`` and ``attend``."""
        decode_only = max_seqlen_q == 1 and slot_mapping.shape[0] == block_table.shape[0]
        return PagedStep(
            slot_mapping, block_table, cu_seqlens_q, seq_lens, max_seqlen_q, decode_only
        )

    def store(self, plan, k, v, k_cache, v_cache) -> None:
        """Write the step's new k/v ``[T, Hkv, D]`` into one layer's cache, cast to its dtype."""
        raise NotImplementedError

    def attend(
        self, plan, q, k_cache, v_cache, scale: float, window: int | None = None
    ) -> torch.Tensor:
        """Attention of the step's queries ``[T, Hq, D]`` over cached + new context. ``window``:
        this layer's sliding window, None for full attention; the query at position ``p`` sees
        the keys at ``(p - window, p]`` (transformers' ``sliding_window``, reference.py). One
        plan serves layers of different windows."""
        raise NotImplementedError

    def decode(
        self, q, k_cache, v_cache, block_table, seq_lens, scale: float, window: int | None = None
    ) -> torch.Tensor:
        """One query per sequence (``q [B, Hq, D]``), no store: the decode-only entry point."""
        B = q.shape[0]
        cu = torch.arange(B + 1, dtype=torch.int32, device=q.device)
        no_store = torch.full((B,), -1, dtype=torch.int64, device=q.device)
        plan = self.prepare(no_store, block_table, cu, seq_lens, 1)
        return self.attend(plan, q, k_cache, v_cache, scale, window)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.device}, {self.dtype}, page_size={self.page_size})"


class TorchBackend(AttentionBackend):
    """reference.py: the spec. Any device and dtype; computes in float32, returns q's dtype."""

    name = "torch"

    @classmethod
    def unavailable(cls, device, dtype, page_size, head_dim):
        return None

    def store(self, plan, k, v, k_cache, v_cache):
        reference.store_kv(k, v, k_cache, v_cache, plan.slot_mapping)

    def attend(self, plan, q, k_cache, v_cache, scale, window=None):
        return reference.extend_attention(
            q, k_cache, v_cache, plan.block_table, plan.cu_seqlens_q, plan.seq_lens, scale, window
        )

    def decode(self, q, k_cache, v_cache, block_table, seq_lens, scale, window=None):
        return reference.paged_decode_attention(
            q, k_cache, v_cache, block_table, seq_lens, scale, window
        )


class CpuBackend(AttentionBackend):
    """cpu.py: the CPU fast path for float32 pools, tested against the reference."""

    name = "cpu"

    @classmethod
    def unavailable(cls, device, dtype, page_size, head_dim):
        if torch.device(device).type != "cpu":
            return f"needs CPU tensors, got {torch.device(device).type}"
        if dtype != torch.float32:
            return f"needs float32, got {dtype}"
        return None

    def prepare(self, slot_mapping, block_table, cu_seqlens_q, seq_lens, max_seqlen_q=None):
        return cpu.plan(block_table, cu_seqlens_q, seq_lens, slot_mapping, self.page_size)

    def store(self, plan, k, v, k_cache, v_cache):
        cpu.store_kv(plan, k, v, k_cache, v_cache)

    def attend(self, plan, q, k_cache, v_cache, scale, window=None):
        check_window(window)
        return cpu.extend_attention(plan, q, k_cache, v_cache, scale, window)


@functools.cache
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def _triton_unavailable(device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    if not _triton_installed():
        return "triton is not installed"
    from ._triton_common import interpreting

    if torch.device(device).type != "cuda" and not interpreting():
        return f"needs CUDA tensors (or TRITON_INTERPRET=1), got {torch.device(device).type}"
    if dtype not in _TRITON_DTYPES:
        return f"needs float16, bfloat16 or float32, got {dtype}"
    if head_dim > 256:
        return f"head_dim must be at most 256, got {head_dim}"
    return None


class TritonBackend(AttentionBackend):
    """Our Triton kernels. A pure decode step takes the split-KV decode kernel (it fills the GPU
    where the extend grid, one program per 64 query rows, would not); anything else the extend
    kernel."""

    name = "triton"

    def __init__(self, device, dtype, page_size, head_dim):
        super().__init__(device, dtype, page_size, head_dim)
        from .triton_decode import paged_decode_attention
        from .triton_extend import extend_attention
        from .triton_store import store_kv

        self._store, self._decode, self._extend = store_kv, paged_decode_attention, extend_attention

    @classmethod
    def unavailable(cls, device, dtype, page_size, head_dim):
        return _triton_unavailable(device, dtype, head_dim)

    def store(self, plan, k, v, k_cache, v_cache):
        self._store(k, v, k_cache, v_cache, plan.slot_mapping)

    def attend(self, plan, q, k_cache, v_cache, scale, window=None):
        if plan.decode_only:
            return self._decode(
                q, k_cache, v_cache, plan.block_table, plan.seq_lens, scale, window=window
            )
        return plan.extend(self._extend, q, k_cache, v_cache, scale, window)

    def decode(self, q, k_cache, v_cache, block_table, seq_lens, scale, window=None):
        return self._decode(q, k_cache, v_cache, block_table, seq_lens, scale, window=window)


class FlashAttnBackend(AttentionBackend):
    """flash_attn.py (the ``block_table`` varlen path) for attention; flash-attn has no paged
    store of its own, so K/V go in with the Triton store kernel (the reference where Triton is
    missing)."""

    name = "flash_attn"

    def __init__(self, device, dtype, page_size, head_dim):
        super().__init__(device, dtype, page_size, head_dim)
        if _triton_unavailable(device, dtype, head_dim) is None:
            from .triton_store import store_kv

            self._store = store_kv
        else:
            self._store = reference.store_kv

    @classmethod
    def unavailable(cls, device, dtype, page_size, head_dim):
        return flash_attn.unavailable_reason(torch.device(device), dtype, page_size, head_dim)

    def store(self, plan, k, v, k_cache, v_cache):
        self._store(k, v, k_cache, v_cache, plan.slot_mapping)

    def attend(self, plan, q, k_cache, v_cache, scale, window=None):
        return plan.extend(flash_attn.extend_attention, q, k_cache, v_cache, scale, window)

    def decode(self, q, k_cache, v_cache, block_table, seq_lens, scale, window=None):
        return flash_attn.paged_decode_attention(
            q, k_cache, v_cache, block_table, seq_lens, scale, window=window
        )


_REGISTRY: dict[str, type[AttentionBackend]] = {
    cls.name: cls for cls in (FlashAttnBackend, TritonBackend, CpuBackend, TorchBackend)
}
BACKENDS = tuple(_REGISTRY)  # every valid name, best first (the automatic choice's order)
_AUTOMATIC = {"cuda": ("flash_attn", "triton", "torch"), "cpu": ("cpu", "torch")}


def backend_class(name: str, source: str = "argument backend") -> type[AttentionBackend]:
    """The class registered under ``name``; a ValueError listing the valid names otherwise."""
    cls = _REGISTRY.get(name)
    if cls is None:
        raise ValueError(
            f"unknown attention backend {name!r} (from {source}); valid choices: "
            f"{', '.join(BACKENDS)} (or None / 'auto' for the best available)"
        )
    return cls


def available_names(device, dtype, page_size: int, head_dim: int) -> list[str]:
    """Names of the backends that can run a pool like this, best first."""
    return [
        n for n, c in _REGISTRY.items() if c.unavailable(device, dtype, page_size, head_dim) is None
    ]


def requested() -> tuple[str | None, str]:
    """The backend named by the environment, and where that came from."""
    value = os.environ.get(ENV_VAR, "").strip().lower()
    return (value or None), f"environment variable {ENV_VAR}"


def choose(
    name: str | None, device, dtype, page_size: int, head_dim: int, *, env: bool = True
) -> type[AttentionBackend]:
    """The class that will run: the one named (argument, else the environment variable when
    ``env``), or the best one for this pool. A named backend that cannot run raises
    BackendUnavailableError with the reason and the valid names; it is never replaced."""
    source = "argument backend"
    if name is None and env:
        name, source = requested()
    if name is None or name == "auto":
        kind = "cuda" if torch.device(device).type == "cuda" else "cpu"
        for candidate in _AUTOMATIC[kind]:
            cls = _REGISTRY[candidate]
            if cls.unavailable(device, dtype, page_size, head_dim) is None:
                return cls
        return TorchBackend
    cls = backend_class(name, source)
    why = cls.unavailable(device, dtype, page_size, head_dim)
    if why is not None:
        raise BackendUnavailableError(
            f"attention backend {name!r} (from {source}) is unavailable: {why}. Valid choices: "
            f"{', '.join(BACKENDS)}; available here: "
            f"{', '.join(available_names(device, dtype, page_size, head_dim))}"
        )
    return cls


def make_backend(
    name: str | None, device, dtype: torch.dtype, page_size: int, head_dim: int
) -> AttentionBackend:
    """The backend for a pool, built once at start-up: ``name`` ("flash_attn", "triton", "cpu",
    "torch"), or None / "auto" for RADIXRAY_ATTENTION_BACKEND if set, else the best available."""
    return choose(name, device, dtype, page_size, head_dim)(device, dtype, page_size, head_dim)
