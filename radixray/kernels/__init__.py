"""Attention on a paged KV pool.

Backends: "torch" (reference.py, everywhere), "triton" and "flash_attn" (CUDA). ``backend=None``
picks the best available for the tensors' device. The kernels issue fills in the fast backends.
"""

from __future__ import annotations

from . import reference
from .reference import extend_attention as _ref_extend
from .reference import paged_decode_attention as _ref_decode
from .reference import store_kv as _ref_store

__all__ = ["store_kv", "paged_decode_attention", "extend_attention", "reference"]


def store_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    _ref_store(k, v, k_cache, v_cache, slot_mapping)


def paged_decode_attention(q, k_cache, v_cache, block_table, seq_lens, scale, backend=None):
    return _ref_decode(q, k_cache, v_cache, block_table, seq_lens, scale)


def extend_attention(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, scale, backend=None):
    return _ref_extend(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, scale)
