"""Argument checks shared by the fast backends: each names the value and what was expected.

Only metadata (shapes, dtypes, strides, devices) is checked, never tensor contents: reading a
CUDA tensor's values would synchronise the device on every call.
"""

from __future__ import annotations

import torch

__all__ = [
    "check_cache",
    "check_decode",
    "check_extend",
    "check_rope_store",
    "check_store",
    "check_window",
]


def _fail(msg: str) -> None:
    raise ValueError(msg)


def check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, int, int, int]:
    """Returns (num_pages, page_size, Hkv, D)."""
    if k_cache.dim() != 4:
        _fail(f"k_cache must be [num_pages, page_size, Hkv, D], got shape {tuple(k_cache.shape)}")
    if v_cache.shape != k_cache.shape:
        _fail(f"v_cache shape {tuple(v_cache.shape)} != k_cache shape {tuple(k_cache.shape)}")
    if v_cache.dtype != k_cache.dtype:
        _fail(f"v_cache dtype {v_cache.dtype} != k_cache dtype {k_cache.dtype}")
    if v_cache.device != k_cache.device:
        _fail(f"v_cache is on {v_cache.device}, k_cache on {k_cache.device}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            _fail(f"{name} must have a contiguous last (head_dim) axis, strides {t.stride()}")
    return tuple(k_cache.shape)  # type: ignore[return-value]


def _check_int_vector(name: str, t: torch.Tensor, length: int, device: torch.device) -> None:
    if t.dim() != 1 or t.shape[0] != length:
        _fail(f"{name} must have shape [{length}], got {tuple(t.shape)}")
    if t.dtype not in (torch.int32, torch.int64):
        _fail(f"{name} must be int32 or int64, got {t.dtype}")
    if t.device != device:
        _fail(f"{name} is on {t.device}, expected {device} (the device of q)")


def _check_q(q: torch.Tensor, k_cache: torch.Tensor, what: str) -> tuple[int, int, int]:
    if q.dim() != 3:
        _fail(f"q must be {what}, got shape {tuple(q.shape)}")
    _, _, Hkv, D = k_cache.shape
    n, Hq, Dq = q.shape
    if Dq != D:
        _fail(f"q head_dim {Dq} != cache head_dim {D}")
    if Hq % Hkv != 0:
        _fail(f"query heads ({Hq}) must be a multiple of KV heads ({Hkv})")
    if q.dtype != k_cache.dtype:
        _fail(f"q dtype {q.dtype} != cache dtype {k_cache.dtype} (cast q before the call)")
    if q.device != k_cache.device:
        _fail(f"q is on {q.device}, the cache on {k_cache.device}")
    if q.stride(-1) != 1:
        _fail(f"q must have a contiguous last (head_dim) axis, strides {q.stride()}")
    return n, Hq, D


def _check_block_table(block_table: torch.Tensor, batch: int, device: torch.device) -> None:
    if block_table.dim() != 2 or block_table.shape[0] != batch:
        _fail(f"block_table must be [B={batch}, max_pages], got {tuple(block_table.shape)}")
    if block_table.dtype != torch.int32:
        _fail(f"block_table must be int32, got {block_table.dtype}")
    if block_table.device != device:
        _fail(f"block_table is on {block_table.device}, expected {device}")


def check_decode(q, k_cache, v_cache, block_table, seq_lens) -> None:
    check_cache(k_cache, v_cache)
    B, _, _ = _check_q(q, k_cache, "[B, Hq, D]")
    _check_block_table(block_table, B, q.device)
    _check_int_vector("seq_lens", seq_lens, B, q.device)


def check_extend(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens) -> None:
    check_cache(k_cache, v_cache)
    _check_q(q, k_cache, "[T, Hq, D]")
    B = block_table.shape[0] if block_table.dim() == 2 else -1
    _check_block_table(block_table, B, q.device)
    _check_int_vector("cu_seqlens_q", cu_seqlens_q, B + 1, q.device)
    _check_int_vector("seq_lens", seq_lens, B, q.device)


def check_store(k, v, k_cache, v_cache, slot_mapping) -> None:
    _, _, Hkv, D = check_cache(k_cache, v_cache)
    if k.dim() != 3 or k.shape[1:] != (Hkv, D):
        _fail(f"k must be [T, Hkv={Hkv}, D={D}], got {tuple(k.shape)}")
    if v.shape != k.shape:
        _fail(f"v shape {tuple(v.shape)} != k shape {tuple(k.shape)}")
    for name, t in (("k", k), ("v", v)):
        if t.device != k_cache.device:
            _fail(f"{name} is on {t.device}, the cache on {k_cache.device}")
        if t.stride(-1) != 1:
            _fail(f"{name} must have a contiguous last (head_dim) axis, strides {t.stride()}")
    _check_int_vector("slot_mapping", slot_mapping, k.shape[0], k_cache.device)


def check_rope_store(
    qkv, positions, slot_mapping, cos, sin, k_cache, v_cache, num_heads, q_norm, k_norm
) -> tuple[int, int]:
    """triton_rope_store.rope_store's arguments; returns (Hkv, D), the pool's."""
    _, _, Hkv, D = check_cache(k_cache, v_cache)
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads % Hkv:
        _fail(f"num_heads must be a positive multiple of the cache's Hkv={Hkv}, got {num_heads!r}")
    width = (num_heads + 2 * Hkv) * D
    if qkv.dim() != 2 or qkv.shape[1] != width:
        _fail(f"qkv must be [T, (num_heads={num_heads} + 2 * Hkv={Hkv}) * D={D}] = [T, {width}], "
              f"got {tuple(qkv.shape)}")  # fmt: skip
    if qkv.dtype != k_cache.dtype or qkv.device != k_cache.device:
        _fail(f"qkv must be {k_cache.dtype} on {k_cache.device} (the cache's), got {qkv.dtype} "
              f"on {qkv.device}")  # fmt: skip
    if qkv.stride(-1) != 1:
        _fail(f"qkv must have a contiguous last axis, strides {qkv.stride()}")
    if D % 2:
        _fail(f"head_dim must be even for rotate-half RoPE, got {D}")
    T = qkv.shape[0]
    _check_int_vector("positions", positions, T, qkv.device)
    _check_int_vector("slot_mapping", slot_mapping, T, qkv.device)
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dim() != 2 or t.shape[1] != D // 2 or t.dtype != torch.float32:
            _fail(f"{name} must be float32 [max_positions, D/2={D // 2}], got {t.dtype} "
                  f"{tuple(t.shape)}")  # fmt: skip
        if t.device != qkv.device or t.stride(-1) != 1:
            _fail(f"{name} must be on {qkv.device} with a contiguous last axis")
    if sin.shape != cos.shape or sin.stride() != cos.stride():
        _fail(f"sin {tuple(sin.shape)} must be laid out as cos {tuple(cos.shape)}")
    if (q_norm is None) != (k_norm is None):
        _fail("q_norm and k_norm must both be given (qk_norm) or both be None")
    for name, w in (("q_norm", q_norm), ("k_norm", k_norm)):
        if w is not None and (w.shape != (D,) or w.dtype != qkv.dtype or w.device != qkv.device):
            _fail(f"{name} must be [{D}] {qkv.dtype} on {qkv.device}, got {tuple(w.shape)} "
                  f"{w.dtype} on {w.device}")  # fmt: skip
    return Hkv, D


def check_window(window) -> None:
    """A sliding window is None (full attention) or a positive int of tokens (the query's own
    position included)."""
    if window is None:
        return
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        _fail(f"window must be None or an int >= 1 (tokens, the query's own too), got {window!r}")
