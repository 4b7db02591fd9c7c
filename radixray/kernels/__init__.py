"""Attention on a paged KV pool.

Two ways in:

* **Backend objects** (backends.py), what the model uses: :func:`make_backend` builds one for a
  pool at start-up (by name, by RADIXRAY_ATTENTION_BACKEND, or the best available), ``prepare``
  runs once per step, ``store`` / ``attend`` once per layer.
* **Functions** for one-off calls and tests: :func:`paged_decode_attention`, :func:`store_kv`,
  :func:`extend_attention`, each choosing its backend from its tensors on every call.

Backends, best first: ``"flash_attn"`` (vLLM's flash-attn fork or flash-attn; CUDA, fp16/bf16,
page size a multiple of 16, or 256 upstream), ``"triton"`` (our kernels; CUDA, fp16/bf16/fp32),
``"cpu"`` (cpu.py; CPU, float32: one plan per step, torch's fused attention), ``"torch"``
(reference.py; anywhere, always float32 math).

Sliding-window attention: every entry point takes ``window`` (None = full attention; ``W`` = the
query at position ``p`` sees keys at ``(p - W, p]``, transformers' ``sliding_window``), per call,
so that one step's plan serves layers of different windows (Gemma 3's local and global layers).

``backend=None`` means: the environment variable RADIXRAY_ATTENTION_BACKEND if set, else the best
backend that can run these tensors (on CPU: "cpu" for float32, else "torch"). A backend named by
argument or environment variable is used or fails with an error naming why and the valid
choices; it is never silently replaced.

Dtypes: the fast backends need q in the cache's dtype; the torch reference computes in float32
whatever it gets and returns q's dtype. ``store_kv`` casts k/v to the cache's dtype.
"""

from __future__ import annotations

import functools

import torch

from . import reference
from .backends import (
    BACKENDS,
    ENV_VAR,
    AttentionBackend,
    BackendUnavailableError,
    available_names,
    choose,
    make_backend,
)

__all__ = [
    "BACKENDS",
    "ENV_VAR",
    "AttentionBackend",
    "BackendUnavailableError",
    "available_backends",
    "extend_attention",
    "make_backend",
    "paged_decode_attention",
    "reference",
    "resolve_backend",
    "store_kv",
]


def _pool_of(k_cache: torch.Tensor) -> tuple:
    """(device, dtype, page_size, head_dim) of a one-layer cache [num_pages, P, Hkv, D]."""
    return k_cache.device, k_cache.dtype, k_cache.shape[1], k_cache.shape[-1]


def available_backends(q: torch.Tensor, k_cache: torch.Tensor) -> list[str]:
    """Backends that can run these tensors, best first."""
    return available_names(q.device, *_pool_of(k_cache)[1:])


def resolve_backend(backend: str | None, q: torch.Tensor, k_cache: torch.Tensor) -> str:
    """The name of the backend that will run: the one asked for (argument, else environment
    variable), or the best one available for these tensors."""
    return choose(backend, q.device, *_pool_of(k_cache)[1:]).name


@functools.lru_cache(maxsize=64)
def _instance(cls: type[AttentionBackend], device, dtype, page_size, head_dim) -> AttentionBackend:
    return cls(device, dtype, page_size, head_dim)


def _backend(backend: str | None, q: torch.Tensor, k_cache: torch.Tensor) -> AttentionBackend:
    device, dtype, page_size, head_dim = q.device, *_pool_of(k_cache)[1:]
    cls = choose(backend, device, dtype, page_size, head_dim)
    return _instance(cls, device, dtype, page_size, head_dim)


def store_kv(k, v, k_cache, v_cache, slot_mapping, backend: str | None = None) -> None:
    """Write k/v [T, Hkv, D] into cache slots (page * P + offset; -1 skips the row), cast to the
    cache's dtype. Backend "flash_attn" stores with the Triton kernel (it has no store of its
    own)."""
    impl = _backend(backend, k, k_cache)
    i32 = {"dtype": torch.int32, "device": k.device}
    # a step of no sequences: only the slots matter to a store
    plan = impl.prepare(
        slot_mapping, torch.zeros(0, 1, **i32), torch.zeros(1, **i32), torch.zeros(0, **i32)
    )
    impl.store(plan, k, v, k_cache, v_cache)


def paged_decode_attention(
    q,
    k_cache,
    v_cache,
    block_table,
    seq_lens,
    scale,
    backend: str | None = None,
    *,
    window: int | None = None,
) -> torch.Tensor:
    """Shapes and semantics: reference.paged_decode_attention (``window``: a sliding window of
    that many tokens, the query's own included; None = full attention)."""
    impl = _backend(backend, q, k_cache)
    return impl.decode(q, k_cache, v_cache, block_table, seq_lens, scale, window)


def extend_attention(
    q,
    k_cache,
    v_cache,
    block_table,
    cu_seqlens_q,
    seq_lens,
    scale,
    backend: str | None = None,
    *,
    max_seqlen_q: int | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Shapes and semantics: reference.extend_attention (``window`` as there). ``max_seqlen_q``:
    the longest q_len, if the caller knows it (an int from the scheduler, never read from a device
    tensor). It lets the fast backends size their grid without a device sync, and 1 sends a pure
    decode batch to the split-KV decode kernel. It must not be smaller than the true maximum."""
    impl = _backend(backend, q, k_cache)
    no_store = torch.full((q.shape[0],), -1, dtype=torch.int64, device=q.device)
    plan = impl.prepare(no_store, block_table, cu_seqlens_q, seq_lens, max_seqlen_q)
    return impl.attend(plan, q, k_cache, v_cache, scale, window)
