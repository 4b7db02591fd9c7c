"""Attention whose scores are soft-capped (Gemma 2: ``cap * tanh(s / cap)``), over the paged
pool, in the model, optionally windowed (a query at position ``p`` sees only keys at
``p - W < k <= p``, transformers' ``sliding_window``).

The attention kernels take a window (every backend: ``radixray.kernels``) but not a cap; Gemma 2's
layers run here: per sequence of the step, the pages that hold its last ``W + q_len - 1``
positions are gathered and attended with a causal, windowed mask in float32. A loop over the
step's sequences (not its tokens). The tests also use it as an independent windowed reference.
"""

from __future__ import annotations

import torch

from .attention import AttentionMetadata

__all__ = ["windowed_attention"]


def windowed_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    attn: AttentionMetadata,
    scale: float,
    window: int | None,
    softcap: float | None = None,
) -> torch.Tensor:
    """``q [T, Hq, D]`` against one layer's pool ``[pages, P, Hkv, D]`` (this step's K/V already
    stored) -> ``[T, Hq, D]`` in q's dtype. ``window`` None: the whole causal context."""
    if window is None:
        window = 1 << 62
    P, Hkv, D = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    groups = q.shape[1] // Hkv
    out = torch.empty_like(q)
    cu, lens = attn.cu_seqlens_q.tolist(), attn.seq_lens.tolist()
    for b, length in enumerate(lens):
        start, end = cu[b], cu[b + 1]
        n = end - start
        if n == 0:
            continue
        first = max(0, length - n - window + 1)  # the oldest key any of these queries sees
        pages = attn.block_table[b, first // P : -(-length // P)].long()
        skip = first % P
        k = k_cache[pages].reshape(-1, Hkv, D)[skip : skip + length - first]
        v = v_cache[pages].reshape(-1, Hkv, D)[skip : skip + length - first]
        k_pos = torch.arange(first, length, device=q.device)
        q_pos = torch.arange(length - n, length, device=q.device)[:, None]
        visible = (k_pos <= q_pos) & (q_pos - k_pos < window)  # [n, keys]
        qf = q[start:end].float().transpose(0, 1)  # [Hq, n, D]
        kf = k.float().repeat_interleave(groups, dim=1).transpose(0, 1)  # [Hq, keys, D]
        vf = v.float().repeat_interleave(groups, dim=1).transpose(0, 1)
        scores = (qf @ kf.transpose(1, 2)) * scale
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        scores = scores.masked_fill(~visible, float("-inf"))
        out[start:end] = (scores.softmax(dim=-1) @ vf).transpose(0, 1).to(q.dtype)
    return out
