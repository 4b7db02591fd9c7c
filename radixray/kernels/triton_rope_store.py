"""RoPE fused with the KV store: one kernel from the qkv projection to the paged pool.

For each of a step's rows, straight out of the projection's output ``qkv [T, (Hq + 2 Hkv) * D]``:

    q, k  --[RMSNorm per head: qk_norm]--> rotate-half RoPE at the row's position --> q out
                                                                                  \\-> k pool
    v     ------------------------------------------------------------------------> v pool

PyTorch's path takes ~8-10 kernels for this (the cos/sin gather and two cats per step, a cast,
the rotation's multiplies and adds, a cast back, two norms of up to eight kernels each, the
store). Here one program handles one row, all its heads, in the model's dtype in and out.

Rounding is the unfused path's (``layers.RMSNorm``, ``layers.apply_rope``, ``store_kv``): the
norm normalises in float32, rounds to the model's dtype, scales by the weight and rounds again
(transformers' order); the rotation reads that, computes ``x1 cos - x2 sin`` and ``x2 cos +
x1 sin`` in float32 from the float32 tables and rounds once. With FMA contraction off (the
launch's ``enable_fp_fusion=False``) those are the same IEEE operations in the same order, so
without a qk-norm the result is bit for bit PyTorch's on a GPU; the norm's sum of squares is
reduced in another order (as triton_norm's is), which may move a result by one unit in the
last place. Triton's CPU interpreter truncates a float32 -> bfloat16 cast instead of rounding
it, one more unit there (tests/kernels/test_triton_rope_store.py states each tolerance).

Only the offset-0 norm (``x / rms(x) * w``: Qwen3, Llama-style) is fused; Gemma's ``1 + w`` form,
partial rotary and NoPE layers keep the PyTorch path (worker/fused.py decides). Positions must be
below the tables' length and slots inside the pool: like every kernel here, the wrapper checks
shapes, never values (reading a device tensor would synchronise the step).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._validate import check_rope_store

__all__ = ["rope_store"]


@triton.jit
def _norm_rotate(
    src,  # [BLOCK_H, BLOCK_HALF] pointers to each head's first half
    mask,
    w_ptr,  # [D] the per-head RMSNorm's weight (QK_NORM only)
    offs_d,
    cos,  # [BLOCK_HALF] float32
    sin,
    eps,
    HALF: tl.constexpr,
    QK_NORM: tl.constexpr,
):
    """One block of heads, normed (if QK_NORM) and rotated: (first halves, second halves) in
    float32, each value as the unfused path would have it before its final rounding."""
    x1 = tl.load(src, mask=mask, other=0.0)
    x2 = tl.load(src + HALF, mask=mask, other=0.0)
    dtype = x1.dtype
    x1, x2 = x1.to(tl.float32), x2.to(tl.float32)
    if QK_NORM:
        sq = tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)
        inv = (1.0 / tl.sqrt(sq / (2 * HALF) + eps))[:, None]
        dmask = offs_d < HALF
        w1 = tl.load(w_ptr + offs_d, mask=dmask, other=0.0).to(tl.float32)[None, :]
        w2 = tl.load(w_ptr + HALF + offs_d, mask=dmask, other=0.0).to(tl.float32)[None, :]
        # RMSNorm's two roundings: normalised, cast; scaled in the model dtype, cast
        x1 = (w1 * (x1 * inv).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        x2 = (w2 * (x2 * inv).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    c, s = cos[None, :], sin[None, :]
    return x1 * c - x2 * s, x2 * c + x1 * s


@triton.jit
def _rope_store_kernel(
    qkv_ptr,  # [T, (Hq + 2 Hkv) * D]: q heads, then k heads, then v heads; rows at stride_qkv
    positions_ptr,  # int [T]: each row's position, the tables' row
    slot_mapping_ptr,  # int [T]: page * P + offset; -1 = the row's k/v are not stored
    cos_ptr,  # float32 [max_pos, D/2], rows at stride_cos
    sin_ptr,  # float32 [max_pos, D/2], rows at stride_cos
    q_norm_ptr,  # [D] (QK_NORM only)
    k_norm_ptr,  # [D] (QK_NORM only)
    q_out_ptr,  # [T, Hq, D] contiguous
    k_cache_ptr,  # [num_pages, P, Hkv, D] written in place
    v_cache_ptr,  # [num_pages, P, Hkv, D] written in place
    stride_qkv,
    stride_cos,
    stride_kcp,
    stride_kct,
    stride_kch,
    stride_vcp,
    stride_vct,
    stride_vch,
    eps,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HALF: tl.constexpr,  # head_dim // 2: the rotation pairs i with i + HALF
    PAGE_SIZE: tl.constexpr,
    QK_NORM: tl.constexpr,
    BLOCK_H: tl.constexpr,  # heads per inner step (a power of two)
    BLOCK_HALF: tl.constexpr,  # HALF padded to a power of two
):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + t).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
    page, offset = slot // PAGE_SIZE, slot % PAGE_SIZE
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    dmask = offs_d < HALF
    cos = tl.load(cos_ptr + pos * stride_cos + offs_d, mask=dmask, other=0.0)
    sin = tl.load(sin_ptr + pos * stride_cos + offs_d, mask=dmask, other=0.0)
    row = qkv_ptr + t * stride_qkv
    D: tl.constexpr = 2 * HALF
    out_dtype = q_out_ptr.dtype.element_ty

    for h0 in range(0, NUM_Q_HEADS, BLOCK_H):
        heads = h0 + offs_h
        mask = (heads < NUM_Q_HEADS)[:, None] & dmask[None, :]
        at = heads[:, None] * D + offs_d[None, :]
        o1, o2 = _norm_rotate(row + at, mask, q_norm_ptr, offs_d, cos, sin, eps, HALF, QK_NORM)
        dst = q_out_ptr + t * (NUM_Q_HEADS * D) + at
        tl.store(dst, o1.to(out_dtype), mask=mask)
        tl.store(dst + HALF, o2.to(out_dtype), mask=mask)

    # the skip test broadcast to a vector: a scalar in a tensor mask trips the interpreter
    keep = tl.zeros([BLOCK_H], dtype=tl.int64) + slot >= 0
    k_row = row + NUM_Q_HEADS * D
    v_row = k_row + NUM_KV_HEADS * D
    for h0 in range(0, NUM_KV_HEADS, BLOCK_H):
        heads = h0 + offs_h
        mask = (keep & (heads < NUM_KV_HEADS))[:, None] & dmask[None, :]
        at = heads[:, None] * D + offs_d[None, :]
        o1, o2 = _norm_rotate(k_row + at, mask, k_norm_ptr, offs_d, cos, sin, eps, HALF, QK_NORM)
        k_dst = k_cache_ptr + page * stride_kcp + offset * stride_kct
        k_dst += heads[:, None] * stride_kch + offs_d[None, :]
        tl.store(k_dst, o1.to(k_cache_ptr.dtype.element_ty), mask=mask)
        tl.store(k_dst + HALF, o2.to(k_cache_ptr.dtype.element_ty), mask=mask)
        v_dst = v_cache_ptr + page * stride_vcp + offset * stride_vct
        v_dst += heads[:, None] * stride_vch + offs_d[None, :]
        tl.store(v_dst, tl.load(v_row + at, mask=mask), mask=mask)  # v: a copy, bits unchanged
        tl.store(v_dst + HALF, tl.load(v_row + at + HALF, mask=mask), mask=mask)


def launch_config(num_heads: int, head_dim: int) -> tuple[int, int, int]:
    """(BLOCK_H, BLOCK_HALF, num_warps): up to 16 heads of a half-head each a step (at D 128,
    two float32 tiles of 16 x 64 per block: no spills at 4 warps, bench_kernels'
    --compile-check), a warp per 512 values of a block."""
    block_half = triton.next_power_of_2(max(head_dim // 2, 1))
    block_h = min(16, triton.next_power_of_2(num_heads))
    return block_h, block_half, max(1, min(8, block_h * block_half // 512))


def rope_store(
    qkv: torch.Tensor,  # [T, (Hq + 2 Hkv) * D] the projection's output, the model's dtype
    positions: torch.Tensor,  # int [T]
    slot_mapping: torch.Tensor,  # int [T]; -1 = do not store this row's k/v
    cos: torch.Tensor,  # float32 [max_pos, D/2] (RotaryEmbedding.cos)
    sin: torch.Tensor,  # float32 [max_pos, D/2] (RotaryEmbedding.sin)
    k_cache: torch.Tensor,  # [num_pages, P, Hkv, D] written in place
    v_cache: torch.Tensor,  # [num_pages, P, Hkv, D] written in place
    num_heads: int,  # Hq
    q_norm: torch.Tensor | None = None,  # [D] per-head RMSNorm weights (qk_norm), or None
    k_norm: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """q normed (with ``q_norm``) and rotated, ``[T, Hq, D]`` in ``qkv``'s dtype; k normed and
    rotated and v as is written into the pool at ``slot_mapping``. Hkv and D are the pool's."""
    Hkv, D = check_rope_store(
        qkv, positions, slot_mapping, cos, sin, k_cache, v_cache, num_heads, q_norm, k_norm
    )
    T = qkv.shape[0]
    q = torch.empty(T, num_heads, D, dtype=qkv.dtype, device=qkv.device)
    if T == 0:
        return q
    block_h, block_half, num_warps = launch_config(max(num_heads, Hkv), D)
    qk_norm = q_norm is not None
    _rope_store_kernel[(T,)](
        qkv,
        positions,
        slot_mapping,
        cos,
        sin,
        q_norm if qk_norm else cos,  # never read without QK_NORM
        k_norm if qk_norm else cos,
        q,
        k_cache,
        v_cache,
        qkv.stride(0),
        cos.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        eps,
        NUM_Q_HEADS=num_heads,
        NUM_KV_HEADS=Hkv,
        HALF=D // 2,
        PAGE_SIZE=k_cache.shape[1],
        QK_NORM=qk_norm,
        BLOCK_H=block_h,
        BLOCK_HALF=block_half,
        num_warps=num_warps,
        enable_fp_fusion=False,  # no FMA: the rotation's products rounded as PyTorch's are
    )
    return q
