"""Extend (prefill) attention in Triton: new tokens of many sequences attend to their cached prefix
pages and causally to each other, reading every key from the paged pool.

Varlen layout and causal alignment (bottom-right, as flash-attn's varlen with ``seqused_k``)::

    sequence b: seq_len L, q_len n new tokens (rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1 of q)
    positions:  0 ........... L-n-1 | L-n ....... L-1
                 cached prefix       | new tokens (their K/V already stored in the pages)
    new token j (position L-n+j) sees keys 0 .. L-n+j

Sliding window (``window`` W, reference.py's convention): row at position p also drops keys at
p - W and before. A program starts at the BLOCK_N block holding its first row's first visible
key, so blocks wholly before the window are never loaded; the partial ones are masked.

One program per (BLOCK_M new tokens, query head, sequence). It walks the keys in BLOCK_N steps up
to the last position its rows can see, with an online softmax (base 2). The grid's first axis is
sized by an upper bound on q_len; programs past their sequence's end return at once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._triton_common import dot, upcast_dot
from ._validate import check_extend, check_window

__all__ = ["extend_attention"]

_LOG2E = 1.4426950408889634


@triton.jit
def _extend_kernel(
    q_ptr,  # [T, Hq, D] new tokens of all sequences, concatenated
    k_cache_ptr,  # [num_pages, P, Hkv, D]
    v_cache_ptr,  # [num_pages, P, Hkv, D]
    block_table_ptr,  # int32 [B, max_pages]
    cu_seqlens_q_ptr,  # int [B + 1]
    seq_lens_ptr,  # int [B] cached + new
    out_ptr,  # [T, Hq, D]
    scale_log2,  # softmax scale * log2(e)
    window,  # sliding window in tokens (read when SLIDING)
    stride_qt,
    stride_qh,
    stride_kp,
    stride_kt,
    stride_kh,
    stride_vp,
    stride_vt,
    stride_vh,
    stride_btb,
    stride_ot,
    stride_oh,
    GROUP: tl.constexpr,  # query heads per KV head
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,  # constexpr so t // P and t % P become shifts
    BLOCK_M: tl.constexpr,  # new tokens per program
    BLOCK_N: tl.constexpr,  # keys per inner step
    BLOCK_D: tl.constexpr,  # HEAD_DIM padded to a power of two
    UPCAST_DOT: tl.constexpr,  # widen bf16 dot operands to fp32 (interpreter only)
    SLIDING: tl.constexpr,  # a sliding window is given
):
    m_block = tl.program_id(0)
    head = tl.program_id(1)
    b = tl.program_id(2)
    q_start = tl.load(cu_seqlens_q_ptr + b).to(tl.int32)
    q_len = tl.load(cu_seqlens_q_ptr + b + 1).to(tl.int32) - q_start
    if m_block * BLOCK_M >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + b).to(tl.int32)
    prefix = seq_len - q_len
    kv_head = head // GROUP

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_mask = offs_m < q_len
    d_mask = offs_d < HEAD_DIM
    pos = prefix + offs_m  # absolute position of each query row

    q = tl.load(
        q_ptr + (q_start + offs_m)[:, None] * stride_qt + head * stride_qh + offs_d[None, :],
        mask=m_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    # a finite floor, not -inf: with a window a row may see nothing in a step, and the floor keeps
    # its rescaling exp2(m_i - m_new) at 1 and its p at 0 instead of NaN
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # keys past the last row's position are invisible to the whole block, and so are keys before
    # the first row's window
    kv_end = tl.minimum(seq_len, prefix + (m_block + 1) * BLOCK_M)
    kv_start = 0
    if SLIDING:  # a compile-time branch: full attention compiles as before (no spills at fp32)
        kv_start = tl.maximum(prefix + m_block * BLOCK_M - window + 1, 0) // BLOCK_N * BLOCK_N
    bt_row = block_table_ptr + b * stride_btb
    for n0 in range(kv_start, kv_end, BLOCK_N):
        t = n0 + offs_n
        t_mask = t < kv_end
        page = tl.load(bt_row + t // PAGE_SIZE, mask=t_mask, other=0).to(tl.int64)
        k_rows = page * stride_kp + (t % PAGE_SIZE) * stride_kt + kv_head * stride_kh
        v_rows = page * stride_vp + (t % PAGE_SIZE) * stride_vt + kv_head * stride_vh
        kv_mask = t_mask[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + k_rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        s = dot(q, tl.trans(k), UPCAST_DOT) * scale_log2  # [BLOCK_M, BLOCK_N]
        causal = t[None, :] <= pos[:, None]
        visible = causal & t_mask[None, :]
        if SLIDING:
            visible &= pos[:, None] - t[None, :] < window
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + v_rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, UPCAST_DOT)
        m_i = m_new

    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # padding rows may see nothing
    tl.store(
        out_ptr + (q_start + offs_m)[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
        o.to(out_ptr.dtype.element_ty),
        mask=m_mask[:, None] & d_mask[None, :],
    )


def _launch_config(head_dim: int, dtype: torch.dtype) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_D, num_warps). Q, K, V tiles live in registers: these are the
    largest that compile for sm_90 without spilling (ptxas, checked offline with
    ``benchmarks/bench_kernels.py --compile-check 90``). fp16/bf16 dots use tensor cores; float32
    dots run on FMA units and need 32-row tiles and eight warps. BLOCK_M = 64 still leaves
    enough programs for prefills of a few hundred tokens."""
    block_d = max(16, triton.next_power_of_2(head_dim))
    if dtype == torch.float32:
        return 32, (32 if block_d <= 128 else 16), block_d, 8
    return 64, (64 if block_d <= 128 else 32), block_d, 4


def extend_attention(
    q: torch.Tensor,  # [T, Hq, D], same dtype as the cache
    k_cache: torch.Tensor,  # [num_pages, P, Hkv, D] (the new tokens' K/V already stored)
    v_cache: torch.Tensor,  # [num_pages, P, Hkv, D]
    block_table: torch.Tensor,  # int32 [B, max_pages]
    cu_seqlens_q: torch.Tensor,  # int [B + 1]
    seq_lens: torch.Tensor,  # int [B] cached + new, >= q_len of the sequence
    scale: float,
    *,
    max_seqlen_q: int | None = None,  # longest q_len; None: T, an upper bound (no device sync)
    out: torch.Tensor | None = None,  # [T, Hq, D] written in place when given
    block_sizes: tuple[int, int] | None = None,  # (BLOCK_M, BLOCK_N) override, for tests
    window: int | None = None,  # sliding window (reference.py); None = full attention
) -> torch.Tensor:
    check_extend(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens)
    check_window(window)
    T, Hq, D = q.shape
    _, P, Hkv, _ = k_cache.shape
    B = block_table.shape[0]
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError(f"out must be like q {tuple(q.shape)} {q.dtype}, got {tuple(out.shape)}")
    if T == 0 or B == 0:
        return out
    block_m, block_n, block_d, num_warps = _launch_config(D, q.dtype)
    if block_sizes is not None:
        block_m, block_n = block_sizes
    max_q = T if max_seqlen_q is None else max_seqlen_q
    grid = (triton.cdiv(max_q, block_m), Hq, B)
    _extend_kernel[grid](
        q,
        k_cache,
        v_cache,
        block_table,
        cu_seqlens_q,
        seq_lens,
        out,
        scale * _LOG2E,
        window or 0,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_table.stride(0),
        out.stride(0),
        out.stride(1),
        GROUP=Hq // Hkv,
        HEAD_DIM=D,
        PAGE_SIZE=P,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        UPCAST_DOT=upcast_dot(q.dtype),
        SLIDING=window is not None,
        num_warps=num_warps,
    )
    return out
