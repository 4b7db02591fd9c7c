"""Paged decode attention in Triton: split-KV ("flash-decoding") with GQA grouping.

One query token per sequence reads its whole context from the paged pool. At small batch that is
too few programs to fill a GPU, so the context is cut into ``num_splits`` ranges handled by
separate programs (stage 1), each producing a partial output and its log-sum-exp; stage 2 merges
the partials exactly::

    sequence b, KV head h, context [0, L):
      split 0: [0, c)   split 1: [c, 2c)  ...   (c = L / num_splits rounded up to BLOCK_N)
         |                 |
      (o_0, lse_0)      (o_1, lse_1)      ...   o_s = softmax-weighted V over the split
                 \\        |        /
       out = sum_s exp(lse_s - lse) * o_s,  lse = log sum_s exp(lse_s)

Sliding window (``window`` W, reference.py's convention): the query at position L-1 sees only
positions [max(0, L - W), L), so the splits divide that range, not [0, L): key blocks before the
window are never loaded, and the cost follows the window, not the context.

GQA: one program handles all ``group = Hq // Hkv`` query heads that read the same KV head, so
each K/V row is loaded once per group, not once per query head. Scores are computed in base 2
(``exp2``) with ``scale * log2(e)`` folded in; the LSE stays in base 2 between the stages.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ._triton_common import dot, upcast_dot
from ._validate import check_decode, check_window

__all__ = ["paged_decode_attention"]

_LOG2E = 1.4426950408889634

# A split covers at least this many BLOCK_N chunks: below that the merge costs more than the
# extra parallelism buys.
_MIN_CHUNKS_PER_SPLIT = 2
# The merge kernel holds all partials of one head in registers: [MAX_SPLITS, D] floats.
_MAX_SPLITS = 64
# "No window": longer than any context, so max(0, L - window) is 0 (one kernel for both cases).
_NO_WINDOW = 1 << 30


@triton.jit
def _decode_split_kernel(
    # inputs
    q_ptr,  # [B, Hq, D]
    k_cache_ptr,  # [num_pages, P, Hkv, D]
    v_cache_ptr,  # [num_pages, P, Hkv, D]
    block_table_ptr,  # int32 [B, max_pages]
    seq_lens_ptr,  # int [B]
    # outputs (float32)
    part_out_ptr,  # [B, Hq, num_splits, D] softmax-normalised partial output of each split
    part_lse_ptr,  # [B, Hq, num_splits] base-2 log-sum-exp of each split's scores
    # scalars
    scale_log2,  # softmax scale * log2(e)
    num_splits,
    window,  # sliding window in tokens, _NO_WINDOW for full attention
    # strides (the last axis of every tensor is contiguous: checked by the wrapper)
    stride_qb,
    stride_qh,
    stride_kp,
    stride_kt,
    stride_kh,
    stride_vp,
    stride_vt,
    stride_vh,
    stride_btb,
    stride_pob,
    stride_poh,
    stride_pos,
    stride_plb,
    stride_plh,
    # compile-time shapes
    GROUP: tl.constexpr,  # query heads per KV head
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,  # constexpr so t // P and t % P become shifts for powers of two
    BLOCK_H: tl.constexpr,  # GROUP padded to >= 16: tl.dot needs every dimension >= 16
    BLOCK_N: tl.constexpr,  # context tokens per inner step
    BLOCK_D: tl.constexpr,  # HEAD_DIM padded to a power of two (80, 96 -> 128)
    UPCAST_DOT: tl.constexpr,  # widen bf16 dot operands to fp32 (interpreter only)
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    seq_len = tl.load(seq_lens_ptr + b).to(tl.int32)
    lo = tl.maximum(seq_len - window, 0)  # the first key the query (at seq_len - 1) can see
    split_len = tl.cdiv(tl.cdiv(seq_len - lo, num_splits), BLOCK_N) * BLOCK_N
    start = lo + split * split_len
    end = tl.minimum(start + split_len, seq_len)

    offs_h = tl.arange(0, BLOCK_H)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    h_mask = offs_h < GROUP
    d_mask = offs_d < HEAD_DIM
    q_heads = kv_head * GROUP + offs_h

    q = tl.load(
        q_ptr + b * stride_qb + q_heads[:, None] * stride_qh + offs_d[None, :],
        mask=h_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)

    bt_row = block_table_ptr + b * stride_btb
    for n0 in range(start, end, BLOCK_N):
        t = n0 + offs_n
        t_mask = t < end
        # token t lives in page block_table[b, t // P] at offset t % P; int64 because a large
        # pool's element offsets pass 2**31
        page = tl.load(bt_row + t // PAGE_SIZE, mask=t_mask, other=0).to(tl.int64)
        k_rows = page * stride_kp + (t % PAGE_SIZE) * stride_kt + kv_head * stride_kh
        v_rows = page * stride_vp + (t % PAGE_SIZE) * stride_vt + kv_head * stride_vh
        kv_mask = t_mask[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + k_rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        s = dot(q, tl.trans(k), UPCAST_DOT) * scale_log2  # [BLOCK_H, BLOCK_N]
        s = tl.where(t_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + v_rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, UPCAST_DOT)
        m_i = m_new

    # an empty split (short sequence, many splits) leaves l_i == 0: lse -inf, output 0
    nonempty = l_i > 0
    lse = tl.where(nonempty, m_i + tl.log2(tl.where(nonempty, l_i, 1.0)), float("-inf"))
    o = acc / tl.where(nonempty, l_i, 1.0)[:, None]
    tl.store(
        part_out_ptr
        + b * stride_pob
        + q_heads[:, None] * stride_poh
        + split * stride_pos
        + offs_d[None, :],
        o,
        mask=h_mask[:, None] & d_mask[None, :],
    )
    tl.store(part_lse_ptr + b * stride_plb + q_heads * stride_plh + split, lse, mask=h_mask)


@triton.jit
def _decode_merge_kernel(
    part_out_ptr,  # float32 [B, Hq, num_splits, D]
    part_lse_ptr,  # float32 [B, Hq, num_splits]
    out_ptr,  # [B, Hq, D] in q's dtype
    num_splits,
    stride_pob,
    stride_poh,
    stride_pos,
    stride_plb,
    stride_plh,
    stride_ob,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,  # num_splits padded to a power of two (tl.arange needs one)
    BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < num_splits
    d_mask = offs_d < HEAD_DIM
    lse = tl.load(
        part_lse_ptr + b * stride_plb + h * stride_plh + offs_s, mask=s_mask, other=float("-inf")
    )
    lse_max = tl.max(lse, 0)  # finite: split 0 always holds the first visible token
    w = tl.exp2(lse - lse_max)  # 0 for empty and padding splits
    parts = tl.load(
        part_out_ptr
        + b * stride_pob
        + h * stride_poh
        + offs_s[:, None] * stride_pos
        + offs_d[None, :],
        mask=s_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    o = tl.sum(w[:, None] * parts, 0) / tl.sum(w, 0)
    tl.store(
        out_ptr + b * stride_ob + h * stride_oh + offs_d, o.to(out_ptr.dtype.element_ty), d_mask
    )


# Split-kernel programs an SM runs at once. bf16, head_dim 128 on sm_90 (``bench_kernels.py
# --compile-check 90``, Triton 3.6-3.9): 96-113 registers x 128 threads, so 4 fit in the 64K
# register file (5 at 96); the 3-stage load pipeline's ~38 KB of shared memory would allow 5.
_PROGRAMS_PER_SM = 4


@functools.lru_cache(maxsize=8)
def _num_programs_to_fill(device: torch.device) -> int:
    """Programs that fill every SM's resident slots at once (one wave)."""
    if device.type != "cuda":
        return 8  # the interpreter: a few splits, so the merge path is exercised on CPU too
    return _PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count


def num_splits_for(batch: int, kv_heads: int, max_len: int, block_n: int, programs: int) -> int:
    """The split count for ``batch`` sequences of at most ``max_len`` tokens over ``kv_heads``
    KV heads, when ``programs`` programs fill the device: as many splits as batch * kv_heads *
    splits stays within ``programs`` (one wave: a program past it would wait for a slot and run
    in a tail), each split keeping at least _MIN_CHUNKS_PER_SPLIT chunks of ``block_n`` tokens,
    at most _MAX_SPLITS.

    Why a full wave of resident programs (``_PROGRAMS_PER_SM`` per SM), not one or two per SM:
    a decode split streams its K/V and does little arithmetic, so its bandwidth is the bytes in
    flight, i.e. the programs resident at once. The first GPU run (H200, 132 SMs, eager,
    benchmarks/README.md) read 1 x 4k and 1 x 32k with the same 264 programs (2 per SM, the
    rule then): the extra 117 MB of the longer context cost 0.092 ms, a marginal 1.3 TB/s (30%
    of the copy), where 16 and 64 sequences (384 and 512 programs) read their extra bytes at
    ~4.3-4.5 TB/s (and 64 x 32k at 93% in all). At 132 SMs one sequence of Hkv = 8 now takes 64
    splits (the cap; 512 programs) at 32k, where it took 33 (one of them empty). A 4k sequence
    keeps 32 (two chunks a split); in a CUDA graph ``max_len`` is the static block table's width
    (the engine's ``max_model_len``), not the length on the device, so a 4k sequence in a 32k
    graph gets 64 splits of one chunk each."""
    want = programs // max(1, batch * kv_heads)
    useful = triton.cdiv(max_len, block_n * _MIN_CHUNKS_PER_SPLIT)
    return max(1, min(want, useful, _MAX_SPLITS))


def choose_num_splits(batch: int, kv_heads: int, max_len: int, block_n: int, device) -> int:
    """:func:`num_splits_for` on ``device``. ``max_len`` is an upper bound (from the block
    table's width), so no device sync is needed."""
    return num_splits_for(batch, kv_heads, max_len, block_n, _num_programs_to_fill(device))


def _launch_config(head_dim: int, group: int, dtype: torch.dtype) -> tuple[int, int, int, int]:
    """(BLOCK_H, BLOCK_N, BLOCK_D, num_warps). The K and V tiles (BLOCK_N x BLOCK_D) live in
    registers; these are the largest tiles that compile for sm_90 without spilling (ptxas,
    checked offline with ``benchmarks/bench_kernels.py --compile-check 90``: 96 registers for
    bf16 D=128). float32 dots run on FMA units, not tensor cores, and need more warps at D=256."""
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_h = max(16, triton.next_power_of_2(group))
    if block_d <= 128:
        return block_h, 64, block_d, 4
    if dtype == torch.float32:
        return block_h, 32, block_d, 8
    return block_h, 32, block_d, 4


def paged_decode_attention(
    q: torch.Tensor,  # [B, Hq, D], same dtype as the cache
    k_cache: torch.Tensor,  # [num_pages, P, Hkv, D] fp16 / bf16 / fp32
    v_cache: torch.Tensor,  # [num_pages, P, Hkv, D]
    block_table: torch.Tensor,  # int32 [B, max_pages]
    seq_lens: torch.Tensor,  # int [B] context length including the query token, >= 1
    scale: float,
    *,
    num_splits: int | None = None,  # None: chosen from the batch and the device
    out: torch.Tensor | None = None,  # [B, Hq, D] written in place when given
    block_n: int | None = None,  # context tokens per inner step (override, for tests)
    window: int | None = None,  # sliding window (reference.py); None = full attention
) -> torch.Tensor:
    check_decode(q, k_cache, v_cache, block_table, seq_lens)
    check_window(window)
    B, Hq, D = q.shape
    _, P, Hkv, _ = k_cache.shape
    group = Hq // Hkv
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError(f"out must be like q {tuple(q.shape)} {q.dtype}, got {tuple(out.shape)}")
    if B == 0:
        return out
    block_h, default_block_n, block_d, num_warps = _launch_config(D, group, q.dtype)
    block_n = block_n or default_block_n
    if num_splits is None:
        max_len = block_table.shape[1] * P
        if window is not None:
            max_len = min(max_len, window)
        num_splits = choose_num_splits(B, Hkv, max_len, block_n, q.device)
    if not 1 <= num_splits <= _MAX_SPLITS:
        raise ValueError(f"num_splits must be in [1, {_MAX_SPLITS}], got {num_splits}")
    part_out = torch.empty(B, Hq, num_splits, D, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(B, Hq, num_splits, dtype=torch.float32, device=q.device)

    _decode_split_kernel[(B, Hkv, num_splits)](
        q,
        k_cache,
        v_cache,
        block_table,
        seq_lens,
        part_out,
        part_lse,
        scale * _LOG2E,
        num_splits,
        _NO_WINDOW if window is None else window,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_table.stride(0),
        part_out.stride(0),
        part_out.stride(1),
        part_out.stride(2),
        part_lse.stride(0),
        part_lse.stride(1),
        GROUP=group,
        HEAD_DIM=D,
        PAGE_SIZE=P,
        BLOCK_H=block_h,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        UPCAST_DOT=upcast_dot(q.dtype),
        num_warps=num_warps,
    )
    _decode_merge_kernel[(B, Hq)](
        part_out,
        part_lse,
        out,
        num_splits,
        part_out.stride(0),
        part_out.stride(1),
        part_out.stride(2),
        part_lse.stride(0),
        part_lse.stride(1),
        out.stride(0),
        out.stride(1),
        HEAD_DIM=D,
        BLOCK_S=triton.next_power_of_2(num_splits),
        BLOCK_D=block_d,
        num_warps=4,
    )
    return out
