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
to each sequence's length; past it, masked. A sliding window (reference.py's convention) gathers
only from the page of the first token a sequence can see, and masks the rest of that page: a
window layer's cost follows the window, not the context.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

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
    mask: torch.Tensor | None  # bool [n, 1, 1, L] True = attend; None when nothing is masked
    length: int  # L, the most tokens gathered for one sequence of the group


@dataclass(frozen=True)
class _Prefill:
    start: int  # rows start:end of q are this sequence's new tokens
    end: int
    pages: torch.Tensor  # int64 page ids of the context it can see, from its first visible page
    mask: torch.Tensor | None  # bool [q_len, L] (prefix, causal, window); None = plain causal
    length: int  # L, tokens gathered (from the first visible page's start to the context's end)


@dataclass(frozen=True)
class _Step:
    """What the attention part of a plan is built from (kept to build a windowed one later)."""

    table: torch.Tensor  # int64 [B, max_pages]
    seq_lens: torch.Tensor  # int [B]
    cu: list[int]
    lens: list[int]
    page_size: int


@dataclass(frozen=True)
class CpuAttentionPlan:
    """Per-step indices and masks, built once by :func:`plan` and read by every layer."""

    num_tokens: int
    slots: torch.Tensor  # int64 [n] flat slots receiving the new K/V
    store_rows: torch.Tensor | None  # int64 [n] rows of k/v to store; None = all rows
    decode: tuple[_DecodeGroup, ...]
    prefill: tuple[_Prefill, ...]
    step: _Step
    # the plans of the sliding windows asked for so far, built on first use: one per distinct
    # window among the model's layers (Gemma 3 has one), shared by every layer with it
    windowed: dict = field(default_factory=dict, compare=False, repr=False)

    def for_window(self, window: int | None) -> CpuAttentionPlan:
        """This step's plan for layers with a sliding window (reference.py's convention)."""
        if window is None or window >= max(self.step.lens, default=0):
            return self  # a window as long as every context changes nothing
        if window not in self.windowed:
            decode, prefill = _attention_parts(self.step, window)
            self.windowed[window] = replace(self, decode=decode, prefill=prefill, windowed={})
        return self.windowed[window]


def plan(
    block_table: torch.Tensor,  # int32 [B, max_pages]
    cu_seqlens_q: torch.Tensor,  # int32 [B + 1]
    seq_lens: torch.Tensor,  # int32 [B]
    slot_mapping: torch.Tensor,  # int [T], -1 = do not store
    page_size: int,
) -> CpuAttentionPlan:
    """Shapes and semantics as reference.extend_attention / reference.store_kv. The plan is for
    full attention; :meth:`CpuAttentionPlan.for_window` gives a sliding window's."""
    cu = cu_seqlens_q.tolist()
    slots = slot_mapping.long()
    store_rows = None
    if slots.numel() and int(slots.min()) < 0:
        store_rows = torch.nonzero(slots >= 0).flatten()
        slots = slots[store_rows]
    step = _Step(block_table.long(), seq_lens, cu, seq_lens.tolist(), page_size)
    decode, prefill = _attention_parts(step, None)
    return CpuAttentionPlan(int(cu[-1]), slots, store_rows, decode, prefill, step)


def _attention_parts(step: _Step, window: int | None) -> tuple[tuple, tuple]:
    """The decode groups and prefills of a step, for full attention or one sliding window. A
    sequence's K/V are gathered from the page holding its first visible token: with a window,
    only the window's pages are read."""
    P, cu, lens, dev = step.page_size, step.cu, step.lens, step.table.device
    B = len(lens)
    # decode row b sees positions lo[b] .. L-1; its gather starts at page lo[b] // P
    lo = [0 if window is None else max(0, L - window) for L in lens]
    first = [lo[b] // P for b in range(B)]
    eff = [lens[b] - first[b] * P for b in range(B)]  # tokens gathered for row b
    decode_seqs = sorted((b for b in range(B) if cu[b + 1] - cu[b] == 1), key=lambda b: -eff[b])
    groups: list[_DecodeGroup] = []
    i = 0
    while i < len(decode_seqs):
        longest, total, j = eff[decode_seqs[i]], 0, i
        while (
            j < len(decode_seqs)
            and longest * (j - i + 1) <= _PAD_FACTOR * (total + eff[decode_seqs[j]]) + _PAD_SLACK
        ):
            total += eff[decode_seqs[j]]
            j += 1
        members = sorted(decode_seqs[i:j])  # row order: one group covering all rows is q
        groups.append(_decode_group(step, members, first, eff, lo, longest))
        i = j

    prefills: list[_Prefill] = []
    for b in range(B):
        s, e = cu[b], cu[b + 1]
        if e - s <= 1:
            continue
        L, n = lens[b], e - s
        visible = 0 if window is None else max(0, L - n - window + 1)  # first row's first key
        base = visible // P * P
        pages = step.table[b, base // P : -(-L // P)]
        mask = None
        if L != n or window is not None:  # a cached prefix (row j at L - n + j) or a window
            k_pos = torch.arange(base, L, device=dev)[None, :]
            q_pos = torch.arange(L - n, L, device=dev)[:, None]
            mask = k_pos <= q_pos
            if window is not None:
                mask &= q_pos - k_pos < window
        prefills.append(_Prefill(s, e, pages, mask, L - base))
    return tuple(groups), tuple(prefills)


def _decode_group(step: _Step, members, first, eff, lo, longest: int) -> _DecodeGroup:
    """One padded group of decode rows: each gathers ceil(longest / P) pages from its first
    visible page (page 0 past its own, masked), masked before its window and past its end."""
    P, dev = step.page_size, step.table.device
    b_rows = torch.tensor(members, device=dev)
    n_cols = -(-longest // P)
    col = torch.arange(n_cols, device=dev)[None, :]
    own_eff = torch.tensor([eff[b] for b in members], device=dev)[:, None]
    used = col * P < own_eff
    own_first = torch.tensor([first[b] for b in members], device=dev)[:, None]
    cols = torch.where(used, own_first + col, 0)
    pages = torch.where(used, step.table[b_rows[:, None], cols], 0)
    mask = None
    skip = [lo[b] - first[b] * P for b in members]  # leading gathered tokens before the window
    if any(eff[b] != longest for b in members) or any(skip):
        tok = torch.arange(longest, device=dev)[None, :]
        mask = (tok < own_eff) & (tok >= torch.tensor(skip, device=dev)[:, None])
        mask = mask[:, None, None, :]
    rows = torch.tensor([step.cu[b] for b in members], device=dev)
    return _DecodeGroup(rows, pages.flatten(), mask, longest)


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
    window: int | None = None,  # sliding window, reference.py's convention; None = full
) -> torch.Tensor:  # [T, Hq, D]
    plan_ = plan_.for_window(window)
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
