"""Plain-PyTorch references for every attention kernel: the spec fast kernels are tested against.

Cache layout (the one vLLM's flash-attn fork expects)::

    k_cache, v_cache: [num_pages, page_size, num_kv_heads, head_dim]

A sequence's tokens live in the pages its ``block_table`` row lists, in order: token ``t`` sits in
page ``block_table[b, t // P]`` at offset ``t % P``. ``slot_mapping`` addresses a single token slot
as ``page * P + offset``.

GQA: query head ``h`` reads KV head ``h // (Hq // Hkv)``.

Everything is computed in float32 whatever the input dtype, and cast back to q's dtype.

Sliding window (``window``, every attention entry point): None is full causal attention; an int
``W >= 1`` lets the query at position ``p`` attend to the keys at positions ``(p - W, p]``, the
last ``W`` tokens including itself. That is transformers' ``sliding_window`` (masking_utils'
``sliding_window_overlay`` keeps key ``j`` for query ``i`` when ``i - j < sliding_window``, on top
of the causal mask) and flash-attn's ``window_size=(W - 1, 0)``. A window at least as long as the
context changes nothing.
"""

from __future__ import annotations

import torch

from ._validate import check_window

__all__ = [
    "store_kv",
    "paged_decode_attention",
    "paged_decode_attention_loop",
    "extend_attention",
    "gather_kv",
]


def store_kv(
    k: torch.Tensor,  # [T, Hkv, D] new keys
    v: torch.Tensor,  # [T, Hkv, D] new values
    k_cache: torch.Tensor,  # [num_pages, P, Hkv, D], written in place
    v_cache: torch.Tensor,  # [num_pages, P, Hkv, D], written in place
    slot_mapping: torch.Tensor,  # int [T]: page * P + offset; -1 = skip this row
) -> None:
    num_pages, P = k_cache.shape[:2]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    kc = k_cache.view(num_pages * P, *k_cache.shape[2:])
    vc = v_cache.view(num_pages * P, *v_cache.shape[2:])
    kc[slots] = k[keep].to(k_cache.dtype)
    vc[slots] = v[keep].to(v_cache.dtype)


def gather_kv(
    cache: torch.Tensor,  # [num_pages, P, Hkv, D]
    pages: torch.Tensor,  # int [n_pages] page ids of one sequence
    length: int,  # tokens to take
) -> torch.Tensor:  # [length, Hkv, D]
    P = cache.shape[1]
    flat = cache.index_select(0, pages.long()).reshape(-1, *cache.shape[2:])
    assert flat.shape[0] >= length, f"{length} tokens need {(length + P - 1) // P} pages"
    return flat[:length]


def _attend(q, k, v, scale: float, q_start: int, window: int | None = None) -> torch.Tensor:
    """q [Lq, Hq, D] at positions q_start.., k/v [Lk, Hkv, D] at positions 0..; causal, and within
    ``window`` when given; float32 out [Lq, Hq, D]."""
    Lq, Hq, D = q.shape
    Lk, Hkv, _ = k.shape
    group = Hq // Hkv
    qf = q.float()
    kf = k.float().repeat_interleave(group, dim=1)  # [Lk, Hq, D]
    vf = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", qf, kf) * scale  # [Hq, Lq, Lk]
    q_pos = torch.arange(q_start, q_start + Lq, device=q.device)[:, None]
    k_pos = torch.arange(Lk, device=q.device)[None, :]
    hidden = k_pos > q_pos  # the future
    if window is not None:
        hidden |= q_pos - k_pos >= window  # further back than the window
    scores = scores.masked_fill(hidden, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, vf)


# Sequences are batched in chunks of at most this many padded K elements (tokens * Hkv * D, about
# 4 MiB in float32): one huge padded batch is *slower* than a loop on CPU (hundreds of MB of
# temporaries fall out of cache and are page-faulted in on every step), a loop per sequence pays
# Python overhead at short contexts. Measured on SmolLM2-135M shapes (benchmarks/README.md).
_CHUNK_ELEMS = 1 << 20


def paged_decode_attention(
    q: torch.Tensor,  # [B, Hq, D] one query token per sequence (its K/V already stored)
    k_cache: torch.Tensor,  # [num_pages, P, Hkv, D]
    v_cache: torch.Tensor,  # [num_pages, P, Hkv, D]
    block_table: torch.Tensor,  # int32 [B, max_pages]
    seq_lens: torch.Tensor,  # int32 [B] context length including the query token (>= 1)
    scale: float,
    window: int | None = None,  # sliding window (module docstring); None = full attention
) -> torch.Tensor:  # [B, Hq, D]
    """Batched: sequences are padded to the longest one in their chunk and the padding is masked,
    so a decode step costs a few tensor ops per chunk instead of a Python loop per sequence.
    Block-table entries past a sequence's last page are never read (they may hold anything)."""
    check_window(window)
    B = q.shape[0]
    out = torch.empty_like(q)
    lens = seq_lens.tolist()
    per_token = k_cache.shape[2] * k_cache.shape[3]
    start = 0
    while start < B:
        end, longest = start + 1, lens[start]
        while end < B and max(longest, lens[end]) * (end - start + 1) * per_token <= _CHUNK_ELEMS:
            longest = max(longest, lens[end])
            end += 1
        out[start:end] = _decode_padded(
            q[start:end], k_cache, v_cache, block_table[start:end], seq_lens[start:end], scale,
            window,
        )  # fmt: skip
        start = end
    return out


def _decode_padded(q, k_cache, v_cache, block_table, seq_lens, scale, window) -> torch.Tensor:
    """paged_decode_attention for one chunk, padded to its longest sequence and masked."""
    B, Hq, D = q.shape
    P, Hkv = k_cache.shape[1], k_cache.shape[2]
    lens = seq_lens.long()
    max_len = int(lens.max())
    n_pages = (max_len + P - 1) // P
    # [B, n_pages] page ids; entries past a sequence's own pages read page 0 (masked below)
    page_idx = torch.arange(n_pages, device=q.device)
    used = page_idx[None, :] < ((lens + P - 1) // P)[:, None]
    pages = torch.where(used, block_table[:, :n_pages].long(), 0)
    with _no_tf32():
        k = _gather_heads_major(k_cache, pages, max_len)  # [B, Hkv, L, D] float32
        v = _gather_heads_major(v_cache, pages, max_len)
        qg = q.float().reshape(B, Hkv, Hq // Hkv, D) * scale  # heads grouped by their KV head
        scores = torch.matmul(qg, k.transpose(-1, -2))  # [B, Hkv, group, L]
        pos = torch.arange(max_len, device=q.device)[None, :]
        pad = pos >= lens[:, None]  # [B, L]
        if window is not None:  # the query sits at lens - 1: keys at lens - window and later
            pad |= pos < lens[:, None] - window
        scores = scores.masked_fill(pad[:, None, None, :], float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1), v)  # [B, Hkv, group, D]
    return out.reshape(B, Hq, D).to(q.dtype)


def _gather_heads_major(cache: torch.Tensor, pages: torch.Tensor, length: int) -> torch.Tensor:
    """[num_pages, P, Hkv, D] gathered at pages [B, n] -> contiguous float32 [B, Hkv, length, D].
    index_select (not advanced indexing) and one contiguous copy in the layout the matmuls want:
    about 3x faster on CPU than matmuls over the strided view (measured, benchmarks/README.md)."""
    B = pages.shape[0]
    Hkv, D = cache.shape[2:]
    flat = cache.index_select(0, pages.flatten()).view(B, -1, Hkv, D)[:, :length]
    out = torch.empty(B, Hkv, length, D, dtype=torch.float32, device=cache.device)
    return out.copy_(flat.transpose(1, 2))  # one copy: transpose and cast together


def paged_decode_attention_loop(
    q: torch.Tensor,  # [B, Hq, D]
    k_cache: torch.Tensor,  # [num_pages, P, Hkv, D]
    v_cache: torch.Tensor,  # [num_pages, P, Hkv, D]
    block_table: torch.Tensor,  # int32 [B, max_pages]
    seq_lens: torch.Tensor,  # int32 [B]
    scale: float,
    window: int | None = None,
) -> torch.Tensor:  # [B, Hq, D]
    """The same as :func:`paged_decode_attention`, one sequence at a time: the plainest statement
    of the spec, kept so the batched version is itself tested against it."""
    B = q.shape[0]
    P = k_cache.shape[1]
    out = torch.empty_like(q)
    with _no_tf32():
        for b in range(B):
            L = int(seq_lens[b])
            pages = block_table[b, : (L + P - 1) // P]
            k = gather_kv(k_cache, pages, L)
            v = gather_kv(v_cache, pages, L)
            out[b] = _attend(q[b : b + 1], k, v, scale, L - 1, window)[0].to(q.dtype)
    return out


def extend_attention(
    q: torch.Tensor,  # [T, Hq, D] new tokens of B sequences, concatenated
    k_cache: torch.Tensor,  # [num_pages, P, Hkv, D] (the new tokens' K/V already stored)
    v_cache: torch.Tensor,  # [num_pages, P, Hkv, D]
    block_table: torch.Tensor,  # int32 [B, max_pages]
    cu_seqlens_q: torch.Tensor,  # int32 [B + 1] offsets of each sequence's new tokens in q
    seq_lens: torch.Tensor,  # int32 [B] context length after the new tokens (cached + new)
    scale: float,
    window: int | None = None,  # sliding window (module docstring); None = full attention
) -> torch.Tensor:  # [T, Hq, D]
    """New token ``j`` of sequence ``b`` is at position ``seq_lens[b] - q_len_b + j`` and attends
    to every cached position and to the new tokens up to itself (causal, bottom-right aligned, as
    flash-attn's varlen with ``seqused_k``), keeping only the last ``window`` positions up to its
    own when a window is given. Decode is the case ``q_len_b == 1``."""
    check_window(window)
    B = block_table.shape[0]
    cu = cu_seqlens_q.tolist()
    q_lens = [cu[b + 1] - cu[b] for b in range(B)]
    out = torch.empty_like(q)
    # Sequences with one new token (the decode part of a mixed batch) go through the batched
    # decode path together; only prefill chunks take the per-sequence loop.
    single = [b for b in range(B) if q_lens[b] == 1]
    if single:
        if len(single) == B:
            return paged_decode_attention(q, k_cache, v_cache, block_table, seq_lens, scale, window)
        idx = torch.tensor(single, device=q.device)
        rows = torch.tensor([cu[b] for b in single], device=q.device)
        out[rows] = paged_decode_attention(
            q[rows], k_cache, v_cache, block_table[idx], seq_lens[idx], scale, window
        )
    P = k_cache.shape[1]
    with _no_tf32():
        for b in range(B):
            s, e = cu[b], cu[b + 1]
            if e - s <= 1:
                continue  # empty, or a decode row done above
            L = int(seq_lens[b])
            pages = block_table[b, : (L + P - 1) // P]
            k = gather_kv(k_cache, pages, L)
            v = gather_kv(v_cache, pages, L)
            out[s:e] = _attend(q[s:e], k, v, scale, L - (e - s), window).to(q.dtype)
    return out


class _no_tf32:
    """Float32 means float32: turn TF32 matmuls off on CUDA for the duration."""

    def __enter__(self):
        self._prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32 = self._prev
