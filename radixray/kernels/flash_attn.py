"""Adapter to vLLM's flash-attn fork (``vllm_flash_attn``) or upstream ``flash_attn``.

Both decode and extend go through ``flash_attn_varlen_func(..., block_table=...)`` over the same
paged cache layout as ours ([num_pages, P, Hkv, D]); the fork removed ``flash_attn_with_kvcache``.
Decode is the varlen case with one query per sequence. Causal masking in flash-attn's varlen
is bottom-right aligned, which is exactly our extend semantics.

The fork takes the per-sequence KV lengths as ``seqused_k`` and pages of any multiple of 16
tokens; upstream flash-attn 2 takes ``cu_seqlens_k`` and pages of a multiple of 256. Both need
CUDA and fp16/bf16. A missing or broken library only makes this backend unavailable.

Sliding window: flash-attn's ``window_size=(left, right)`` lets the query at position ``i``
(bottom-right aligned) attend to keys in ``[i - left, i + right]`` inclusive, ``-1`` meaning
unbounded. Our ``window`` W (keys in ``(p - W, p]``, reference.py) is therefore
``window_size=(W - 1, 0)``; see :func:`window_size`.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
from collections.abc import Callable
from typing import NamedTuple

import torch

from ._validate import check_decode, check_extend, check_window

__all__ = [
    "available",
    "unavailable_reason",
    "paged_decode_attention",
    "extend_attention",
    "window_size",
]

# Tried in order. vLLM's bundled copy last: importing it imports all of vLLM.
_MODULES = ("vllm_flash_attn", "flash_attn", "vllm.vllm_flash_attn")
_DTYPES = (torch.float16, torch.bfloat16)


class _Lib(NamedTuple):
    fn: Callable
    module: str
    has_seqused_k: bool  # the fork's API; upstream needs cu_seqlens_k instead
    page_multiple: int


@functools.lru_cache(maxsize=1)
def _load() -> _Lib | str:
    """The library, or why there is none."""
    why = []
    for name in _MODULES:
        root = name.split(".")[0]
        if importlib.util.find_spec(root) is None:
            why.append(f"{name}: not installed")
            continue
        try:
            mod = importlib.import_module(name)
        except Exception as e:  # a broken CUDA build raises OSError/RuntimeError, not ImportError
            why.append(f"{name}: import failed ({type(e).__name__}: {e})")
            continue
        fn = getattr(mod, "flash_attn_varlen_func", None)
        params = inspect.signature(fn).parameters if fn is not None else {}
        if "block_table" not in params:
            why.append(f"{name}: flash_attn_varlen_func has no block_table (too old)")
            continue
        has_seqused_k = "seqused_k" in params
        return _Lib(fn, name, has_seqused_k, 16 if has_seqused_k else 256)
    return "; ".join(why)


def unavailable_reason(
    device: torch.device, dtype: torch.dtype, page_size: int, head_dim: int
) -> str | None:
    """None when this backend can run these tensors, else why not (for error messages)."""
    if device.type != "cuda":
        return f"needs CUDA tensors, got {device.type}"
    if dtype not in _DTYPES:
        return f"needs float16 or bfloat16, got {dtype}"
    if head_dim % 8 != 0 or head_dim > 256:
        return f"head_dim must be a multiple of 8 up to 256, got {head_dim}"
    lib = _load()
    if isinstance(lib, str):
        return lib
    if page_size % lib.page_multiple != 0:
        return f"{lib.module} needs page_size % {lib.page_multiple} == 0, got {page_size}"
    return None


def available() -> bool:
    """The library imports (whatever the tensors)."""
    return not isinstance(_load(), str)


def _kv_lengths(lib: _Lib, seq_lens: torch.Tensor) -> dict:
    seq_lens = seq_lens.to(torch.int32)
    if lib.has_seqused_k:
        return {"seqused_k": seq_lens}
    cu_k = torch.zeros(seq_lens.shape[0] + 1, dtype=torch.int32, device=seq_lens.device)
    torch.cumsum(seq_lens, 0, out=cu_k[1:])
    return {"cu_seqlens_k": cu_k}


def window_size(window: int | None) -> tuple[int, int]:
    """flash-attn's ``window_size`` for our ``window``: ``(window - 1, 0)``, or ``(-1, -1)``
    (no window) for None. With ``causal=True`` the right side is 0 either way."""
    check_window(window)
    return (-1, -1) if window is None else (window - 1, 0)


def _window_kwargs(window: int | None) -> dict:
    """Nothing for full attention (the call stays what it was), else ``window_size``."""
    return {} if window is None else {"window_size": window_size(window)}


def _require(q: torch.Tensor, k_cache: torch.Tensor) -> _Lib:
    why = unavailable_reason(q.device, q.dtype, k_cache.shape[1], q.shape[-1])
    if why is not None:
        raise RuntimeError(f"flash_attn backend unavailable: {why}")
    return _load()  # type: ignore[return-value]


def paged_decode_attention(
    q: torch.Tensor,  # [B, Hq, D] fp16/bf16, same dtype as the cache
    k_cache: torch.Tensor,  # [num_pages, P, Hkv, D]
    v_cache: torch.Tensor,  # [num_pages, P, Hkv, D]
    block_table: torch.Tensor,  # int32 [B, max_pages]
    seq_lens: torch.Tensor,  # int [B] including the query token
    scale: float,
    *,
    window: int | None = None,  # sliding window (reference.py); None = full attention
) -> torch.Tensor:  # [B, Hq, D]
    check_decode(q, k_cache, v_cache, block_table, seq_lens)
    check_window(window)
    lib = _require(q, k_cache)
    B = q.shape[0]
    cu_q = torch.arange(B + 1, dtype=torch.int32, device=q.device)
    return lib.fn(
        q=q,
        k=k_cache,
        v=v_cache,
        cu_seqlens_q=cu_q,
        max_seqlen_q=1,
        # an upper bound from the table's width: exact lengths would cost a device sync
        max_seqlen_k=block_table.shape[1] * k_cache.shape[1],
        softmax_scale=scale,
        causal=True,
        block_table=block_table,
        **_kv_lengths(lib, seq_lens),
        **_window_kwargs(window),
    )


def extend_attention(
    q: torch.Tensor,  # [T, Hq, D] fp16/bf16
    k_cache: torch.Tensor,  # [num_pages, P, Hkv, D]
    v_cache: torch.Tensor,  # [num_pages, P, Hkv, D]
    block_table: torch.Tensor,  # int32 [B, max_pages]
    cu_seqlens_q: torch.Tensor,  # int32 [B + 1]
    seq_lens: torch.Tensor,  # int [B] cached + new
    scale: float,
    *,
    max_seqlen_q: int | None = None,  # None: T, an upper bound
    window: int | None = None,  # sliding window (reference.py); None = full attention
) -> torch.Tensor:  # [T, Hq, D]
    check_extend(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens)
    check_window(window)
    lib = _require(q, k_cache)
    return lib.fn(
        q=q,
        k=k_cache,
        v=v_cache,
        cu_seqlens_q=cu_seqlens_q.to(torch.int32),
        max_seqlen_q=q.shape[0] if max_seqlen_q is None else max_seqlen_q,
        max_seqlen_k=block_table.shape[1] * k_cache.shape[1],
        softmax_scale=scale,
        causal=True,
        block_table=block_table,
        **_kv_lengths(lib, seq_lens),
        **_window_kwargs(window),
    )
