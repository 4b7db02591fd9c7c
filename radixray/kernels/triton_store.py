"""store_kv in Triton: scatter new K/V rows into their cache slots (slot -1 = skip the row)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._validate import check_store

__all__ = ["store_kv"]


@triton.jit
def _store_kv_kernel(
    k_ptr,  # [T, Hkv, D] new keys
    v_ptr,  # [T, Hkv, D] new values
    k_cache_ptr,  # [num_pages, P, Hkv, D] written in place
    v_cache_ptr,  # [num_pages, P, Hkv, D] written in place
    slot_mapping_ptr,  # int [T]: page * P + offset, -1 = skip
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcp,
    stride_kct,
    stride_kch,
    stride_vcp,
    stride_vct,
    stride_vch,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,  # constexpr so slot // P and slot % P become shifts
    BLOCK_H: tl.constexpr,  # NUM_KV_HEADS padded to a power of two (tl.arange needs one)
    BLOCK_D: tl.constexpr,  # HEAD_DIM padded to a power of two
):
    t = tl.program_id(0)  # one program per token: all its heads in one [BLOCK_H, BLOCK_D] tile
    slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
    page = slot // PAGE_SIZE
    offset = slot % PAGE_SIZE
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    # the skip test broadcast to a vector: a scalar in a tensor mask trips the interpreter
    keep = (tl.zeros([BLOCK_H], dtype=tl.int64) + slot >= 0) & (offs_h < NUM_KV_HEADS)
    mask = keep[:, None] & (offs_d < HEAD_DIM)[None, :]
    k = tl.load(k_ptr + t * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
    v = tl.load(v_ptr + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    k_dst = page * stride_kcp + offset * stride_kct + offs_h[:, None] * stride_kch
    v_dst = page * stride_vcp + offset * stride_vct + offs_h[:, None] * stride_vch
    tl.store(k_cache_ptr + k_dst + offs_d[None, :], k, mask=mask)
    tl.store(v_cache_ptr + v_dst + offs_d[None, :], v, mask=mask)


def store_kv(
    k: torch.Tensor,  # [T, Hkv, D] any float dtype; cast to the cache's first
    v: torch.Tensor,  # [T, Hkv, D]
    k_cache: torch.Tensor,  # [num_pages, P, Hkv, D] written in place
    v_cache: torch.Tensor,  # [num_pages, P, Hkv, D] written in place
    slot_mapping: torch.Tensor,  # int [T]: page * P + offset; -1 = skip this row
) -> None:
    check_store(k, v, k_cache, v_cache, slot_mapping)
    T, Hkv, D = k.shape
    if T == 0:
        return
    # Cast in torch (round-to-nearest-even), so the kernel copies bits: results equal the
    # reference exactly, and the interpreter's truncating float32 -> bf16 cast is never used.
    k = k.to(k_cache.dtype)
    v = v.to(v_cache.dtype)
    _store_kv_kernel[(T,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        NUM_KV_HEADS=Hkv,
        HEAD_DIM=D,
        PAGE_SIZE=k_cache.shape[1],
        BLOCK_H=triton.next_power_of_2(Hkv),
        BLOCK_D=triton.next_power_of_2(D),
        num_warps=4,
    )
