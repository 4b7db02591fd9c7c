"""The "cpu" backend (backends.CpuBackend, the automatic choice on CPU for float32 caches): paged
store / extend attention.

reference.py stays the spec (and what the "torch" backend runs); this module
computes the same thing faster and is tested against it (tests/kernels/test_cpu.py, float32
tolerance: it sums in a different order, so it is not bitwise equal). What makes it faster:

* **One plan per step, shared by every layer.** Where each sequence's tokens sit in the pool
  (flat slot indices), the padding and causal masks, and which rows are decode rows depend only
  on the batch, not on the layer; :func:`plan` computes them once per forward instead of
  30 times.
* **torch's fused attention** (``F.scaled_dot_product_attention``, float32 in, float32 math)
  on K/V gathered a page at a time (one ``index_select`` each) and read through strided views:
  no score matrix in memory for long prefills, no repeat of K/V per query head (GQA is native),
  no extra copy.
* **Decode rows are grouped by length** so that a long sequence does not pad every short one to
  its length (at most ~25% padding per group, plus a little slack for short contexts).

Store: flat slot ``page * P + offset`` in the cache viewed as ``[num_pages * P, Hkv, D]``.
Attention: whole pages are gathered (the cache viewed as ``[num_pages, P * Hkv * D]``) and cut
to each sequence's length; past it, masked.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["CpuAttentionPlan", "extend_attention", "plan", "store_kv"]

# A decode group may pad up to this factor over its real tokens (plus _PAD_SLACK tokens per
# group) before a new group starts: one SDPA call per group costs ~0.1 ms of fixed overhead, so
# splitting short contexts finely would cost more than the padding it saves.
_PAD_FACTOR = 1.25
_PAD_SLACK = 256


@dataclass(frozen=True)
class _DecodeGroup:
    rows: torch.Tensor  # int64 [n] rows of q (one per sequence)
    pages: torch.Tensor  # int64 [n * ceil(L / P)] page ids, padded with page 0
    mask: torch.Tensor | None  # bool [n, 1, 1, L] True = attend; None when nothing is padded
    length: int  # L, the longest context in the group


@dataclass(frozen=True)
class _Prefill:
    start: int  # rows start:end of q are this sequence's new tokens
    end: int
    pages: torch.Tensor  # int64 [ceil(L / P)] page ids of its whole context
    mask: torch.Tensor | None  # bool [q_len, L] (cached prefix + causal); None = plain causal
    length: int  # L


@dataclass(frozen=True)
class CpuAttentionPlan:
    """Per-step indices and masks, built once by :func:`plan` and read by every layer."""

    num_tokens: int
    slots: torch.Tensor  # int64 [n] flat slots receiving the new K/V
    store_rows: torch.Tensor | None  # int64 [n] rows of k/v to store; None = all rows
    decode: tuple[_DecodeGroup, ...]
    prefill: tuple[_Prefill, ...]


def plan(
    block_table: torch.Tensor,  # int32 [B, max_pages]
    cu_seqlens_q: torch.Tensor,  # int32 [B + 1]
    seq_lens: torch.Tensor,  # int32 [B]
    slot_mapping: torch.Tensor,  # int [T], -1 = do not store
    page_size: int,
) -> CpuAttentionPlan:
    """Shapes and semantics as reference.extend_attention / reference.store_kv."""
    P = page_size
    dev = block_table.device
    cu = cu_seqlens_q.tolist()
    lens = seq_lens.tolist()
    B = len(lens)
    table = block_table.long()

    slots = slot_mapping.long()
    store_rows = None
    if slots.numel() and int(slots.min()) < 0:
        store_rows = torch.nonzero(slots >= 0).flatten()
        slots = slots[store_rows]

    def page_ids(b_rows: torch.Tensor, length: int) -> torch.Tensor:  # [n, ceil(length / P)]
        return table[b_rows][:, : -(-length // P)]

    decode_seqs = sorted((b for b in range(B) if cu[b + 1] - cu[b] == 1), key=lambda b: -lens[b])
    groups: list[_DecodeGroup] = []
    i = 0
    while i < len(decode_seqs):
        longest, total, j = lens[decode_seqs[i]], 0, i
        while (
            j < len(decode_seqs)
            and longest * (j - i + 1) <= _PAD_FACTOR * (total + lens[decode_seqs[j]]) + _PAD_SLACK
        ):
            total += lens[decode_seqs[j]]
            j += 1
        members = sorted(decode_seqs[i:j])  # row order: one group covering all rows is q
        b_rows = torch.tensor(members, device=dev)
        pages = page_ids(b_rows, longest)
        mask = None
        if any(lens[b] != longest for b in members):
            own = seq_lens[b_rows].long()[:, None]
            used = torch.arange(pages.shape[1], device=dev)[None, :] * P < own
            pages = torch.where(used, pages, 0)  # past its own pages: read page 0, masked below
            mask = (torch.arange(longest, device=dev)[None, :] < own)[:, None, None, :]
        rows = torch.tensor([cu[b] for b in members], device=dev)
        groups.append(_DecodeGroup(rows, pages.flatten(), mask, longest))
        i = j

    prefills: list[_Prefill] = []
    for b in range(B):
        s, e = cu[b], cu[b + 1]
        if e - s <= 1:
            continue
        L = lens[b]
        pages = page_ids(torch.tensor([b], device=dev), L)[0]
        mask = None
        if L != e - s:  # a cached prefix: new token j sits at position L - q_len + j
            k_pos = torch.arange(L, device=dev)[None, :]
            q_pos = torch.arange(L - (e - s), L, device=dev)[:, None]
            mask = k_pos <= q_pos
        prefills.append(_Prefill(s, e, pages, mask, L))
    return CpuAttentionPlan(int(cu[-1]), slots, store_rows, tuple(groups), tuple(prefills))


def store_kv(
    plan_: CpuAttentionPlan,
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,
    k_cache: torch.Tensor,  # [num_pages, P, Hkv, D], written in place
    v_cache: torch.Tensor,
) -> None:
    if plan_.store_rows is not None:
        k, v = k[plan_.store_rows], v[plan_.store_rows]
    Hkv, D = k_cache.shape[2:]
    k_cache.view(-1, Hkv, D).index_copy_(0, plan_.slots, k.to(k_cache.dtype))
    v_cache.view(-1, Hkv, D).index_copy_(0, plan_.slots, v.to(v_cache.dtype))


def extend_attention(
    plan_: CpuAttentionPlan,
    q: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,  # [num_pages, P, Hkv, D]
    v_cache: torch.Tensor,
    scale: float,
) -> torch.Tensor:  # [T, Hq, D]
    T, Hq, D = q.shape
    num_pages, P, Hkv = k_cache.shape[:3]
    group = Hq // Hkv
    # pages as rows: gathering whole pages copies P * Hkv * D contiguous floats per index
    kp = k_cache.view(num_pages, -1)
    vp = v_cache.view(num_pages, -1)
    only_decode = len(plan_.decode) == 1 and not plan_.prefill
    out = None if only_decode else torch.empty_like(q)
    for g in plan_.decode:
        n, L = g.rows.shape[0], g.length
        # [n, pages * P, Hkv, D] gathered, cut to L and read as [n, Hkv, L, D]
        k = kp.index_select(0, g.pages).view(n, -1, Hkv, D)[:, :L].transpose(1, 2)
        v = vp.index_select(0, g.pages).view(n, -1, Hkv, D)[:, :L].transpose(1, 2)
        # queries grouped by their KV head: [n, Hkv, group, D]
        qg = (q if only_decode else q.index_select(0, g.rows)).reshape(n, Hkv, group, D)
        o = F.scaled_dot_product_attention(qg, k, v, attn_mask=g.mask, scale=scale)
        if only_decode:
            return o.reshape(T, Hq, D)
        out.index_copy_(0, g.rows, o.reshape(n, Hq, D))
    for p in plan_.prefill:
        L = p.length
        k = kp.index_select(0, p.pages).view(-1, Hkv, D)[:L].transpose(0, 1)[None]
        v = vp.index_select(0, p.pages).view(-1, Hkv, D)[:L].transpose(0, 1)[None]
        qs = q[p.start : p.end].transpose(0, 1)[None]  # [1, Hq, q_len, D]
        o = F.scaled_dot_product_attention(
            qs, k, v, attn_mask=p.mask, is_causal=p.mask is None, scale=scale, enable_gqa=True
        )
        out[p.start : p.end] = o[0].transpose(0, 1)
    return out
