"""Attention on a paged KV pool, with the backend chosen per call.

Backends, best first: ``"flash_attn"`` (vLLM's flash-attn fork or flash-attn; CUDA, fp16/bf16,
page size a multiple of 16, or 256 upstream), ``"triton"`` (our kernels; CUDA, fp16/bf16/fp32),
``"torch"`` (reference.py; anywhere, always float32 math).

The automatic choice on CPU with a float32 cache runs the "torch" backend's fast path (cpu.py:
one plan per step shared by all layers, torch's fused attention), which is tested against the
reference. Callers opt in per step with :func:`cpu_plan` and pass the plan to ``store_kv`` and
``extend_attention``; without a plan (or with ``backend="torch"`` named) the reference runs.

``backend=None`` means: the environment variable RADIXRAY_ATTENTION_BACKEND if set, else the best
backend that can run these tensors (on CPU that is always "torch"). A backend named by argument
or environment variable is used or fails with an error naming why and the valid choices; it is
never silently replaced.

Dtypes: the fast backends need q in the cache's dtype; the torch reference computes in float32
whatever it gets and returns q's dtype. ``store_kv`` casts k/v to the cache's dtype.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from . import cpu, reference

__all__ = [
    "BACKENDS",
    "ENV_VAR",
    "BackendUnavailableError",
    "available_backends",
    "cpu_plan",
    "extend_attention",
    "paged_decode_attention",
    "reference",
    "resolve_backend",
    "store_kv",
]

BACKENDS = ("flash_attn", "triton", "torch")  # preference order for backend=None
ENV_VAR = "RADIXRAY_ATTENTION_BACKEND"
_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class BackendUnavailableError(RuntimeError):
    """A backend was asked for by name and cannot run these tensors here."""


def _requested() -> tuple[str | None, str]:
    """The backend named by the environment (read here, and only here), and where from."""
    value = os.environ.get(ENV_VAR, "").strip().lower()
    return (value or None), f"environment variable {ENV_VAR}"


def _triton_unavailable(device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed"
    from ._triton_common import interpreting

    if device.type != "cuda" and not interpreting():
        return f"needs CUDA tensors (or TRITON_INTERPRET=1), got {device.type}"
    if dtype not in _TRITON_DTYPES:
        return f"needs float16, bfloat16 or float32, got {dtype}"
    if head_dim > 256:
        return f"head_dim must be at most 256, got {head_dim}"
    return None


def _unavailable(name: str, q: torch.Tensor, k_cache: torch.Tensor) -> str | None:
    if name == "torch":
        return None
    if name == "triton":
        return _triton_unavailable(q.device, k_cache.dtype, k_cache.shape[-1])
    from . import flash_attn

    return flash_attn.unavailable_reason(q.device, k_cache.dtype, k_cache.shape[1], q.shape[-1])


def available_backends(q: torch.Tensor, k_cache: torch.Tensor) -> list[str]:
    """Backends that can run these tensors, best first."""
    return [name for name in BACKENDS if _unavailable(name, q, k_cache) is None]


def resolve_backend(backend: str | None, q: torch.Tensor, k_cache: torch.Tensor) -> str:
    """The backend that will run: the one asked for (argument, else environment variable), or
    the best one available for these tensors. On CPU the automatic choice is always "torch"
    (Triton runs there only in its slow interpreter, which is for tests)."""
    source = "argument backend"
    if backend is None:
        backend, source = _requested()
    if backend is None or backend == "auto":
        if q.device.type != "cuda":
            return "torch"
        return next(name for name in BACKENDS if _unavailable(name, q, k_cache) is None)
    if backend not in BACKENDS:
        raise ValueError(
            f"unknown attention backend {backend!r} (from {source}); valid choices: "
            f"{', '.join(BACKENDS)} (or None / 'auto' for the best available)"
        )
    why = _unavailable(backend, q, k_cache)
    if why is not None:
        raise BackendUnavailableError(
            f"attention backend {backend!r} (from {source}) is unavailable: {why}. Valid "
            f"choices: {', '.join(BACKENDS)}; available for these tensors: "
            f"{', '.join(available_backends(q, k_cache))}"
        )
    return backend


def cpu_plan(
    block_table, cu_seqlens_q, seq_lens, slot_mapping, k_cache, backend: str | None = None
) -> cpu.CpuAttentionPlan | None:
    """The per-step plan of the CPU fast path (cpu.py), or None where it does not apply. It
    applies when the backend is chosen automatically (``backend`` None or "auto" and no
    environment override) and the cache is a float32 CPU tensor. Build it once per forward and
    pass it as ``plan=`` to every layer's ``store_kv`` / ``extend_attention``."""
    if backend is None:
        backend, _ = _requested()
    if backend not in (None, "auto"):
        return None
    if k_cache.device.type != "cpu" or k_cache.dtype != torch.float32:
        return None
    return cpu.plan(block_table, cu_seqlens_q, seq_lens, slot_mapping, k_cache.shape[-3])


def store_kv(
    k, v, k_cache, v_cache, slot_mapping, backend: str | None = None, *, plan=None
) -> None:
    """Write k/v [T, Hkv, D] into cache slots (page * P + offset; -1 skips the row), cast to the
    cache's dtype. Backend "flash_attn" stores with the Triton kernel (it has no store of its
    own). ``plan``: from :func:`cpu_plan` for this step (then slot_mapping is not read again)."""
    if plan is not None:
        cpu.store_kv(plan, k, v, k_cache, v_cache)
        return
    name = resolve_backend(backend, k, k_cache)
    if name != "torch" and _triton_unavailable(k.device, k_cache.dtype, k.shape[-1]) is None:
        from .triton_store import store_kv as triton_store

        triton_store(k, v, k_cache, v_cache, slot_mapping)
    else:
        reference.store_kv(k, v, k_cache, v_cache, slot_mapping)


def paged_decode_attention(
    q, k_cache, v_cache, block_table, seq_lens, scale, backend: str | None = None
) -> torch.Tensor:
    """Shapes and semantics: reference.paged_decode_attention."""
    name = resolve_backend(backend, q, k_cache)
    if name == "torch":
        return reference.paged_decode_attention(q, k_cache, v_cache, block_table, seq_lens, scale)
    if name == "triton":
        from .triton_decode import paged_decode_attention as fn
    else:
        from .flash_attn import paged_decode_attention as fn
    return fn(q, k_cache, v_cache, block_table, seq_lens, scale)


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
    plan=None,
) -> torch.Tensor:
    """Shapes and semantics: reference.extend_attention. ``max_seqlen_q``: the longest q_len,
    if the caller knows it (an int from the scheduler, never read from a device tensor). It lets
    the fast backends size their grid without a device sync, and 1 sends a pure decode batch to
    the split-KV decode kernel. It must not be smaller than the true maximum. ``plan``: from
    :func:`cpu_plan` for this step; the CPU fast path then runs (block_table, cu_seqlens_q and
    seq_lens are those the plan was built from and are not read again)."""
    if plan is not None:
        return cpu.extend_attention(plan, q, k_cache, v_cache, scale)
    name = resolve_backend(backend, q, k_cache)
    args = (q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, scale)
    if name == "torch":
        return reference.extend_attention(*args)
    if name == "triton":
        if max_seqlen_q == 1 and q.shape[0] == block_table.shape[0]:
            # every sequence has exactly one new token: the split-KV decode kernel fills the GPU
            # where the extend grid (one program per 64 query rows) would not
            from .triton_decode import paged_decode_attention as decode

            return decode(q, k_cache, v_cache, block_table, seq_lens, scale)
        from .triton_extend import extend_attention as fn
    else:
        from .flash_attn import extend_attention as fn
    return fn(*args, max_seqlen_q=max_seqlen_q)
