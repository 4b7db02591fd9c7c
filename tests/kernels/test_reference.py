"""The batched torch reference against the per-sequence loop that states the spec, plus the
reference's own semantics (store_kv skips -1, extend's causal alignment)."""

from __future__ import annotations

import math

import pytest
import torch

from radixray.kernels import reference
from tests.kernels.cases import (
    assert_close,
    edge_lengths,
    make_cu_seqlens,
    make_paged_kv,
    make_query,
    nan_like,
)

F32 = torch.float32


@pytest.mark.parametrize("P", [1, 4, 16, 256])
@pytest.mark.parametrize("Hq,Hkv", [(4, 4), (6, 2), (8, 1)])
def test_batched_decode_matches_loop(P, Hq, Hkv):
    gen = torch.Generator().manual_seed(P + Hq)
    lens = edge_lengths(P, many_pages=1 if P == 256 else 4)
    kv = make_paged_kv(lens, P, Hkv, 16, F32, "cpu", gen)
    q = make_query(len(lens), Hq, 16, F32, "cpu", gen)
    args = (q, kv.k_cache, kv.v_cache, kv.block_table, kv.seq_lens, 0.25)
    assert_close(
        reference.paged_decode_attention(*args), reference.paged_decode_attention_loop(*args), F32
    )


def test_batched_decode_in_chunks(monkeypatch):
    """A tiny chunk budget forces several chunks (and one sequence alone over budget)."""
    monkeypatch.setattr(reference, "_CHUNK_ELEMS", 40 * 2 * 8)
    gen = torch.Generator().manual_seed(1)
    lens = [3, 50, 7, 7, 1, 33, 12]
    kv = make_paged_kv(lens, 4, 2, 8, F32, "cpu", gen)
    q = make_query(len(lens), 4, 8, F32, "cpu", gen)
    args = (q, kv.k_cache, kv.v_cache, kv.block_table, kv.seq_lens, 0.3)
    assert_close(
        reference.paged_decode_attention(*args), reference.paged_decode_attention_loop(*args), F32
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_low_precision_returns_q_dtype(dtype):
    gen = torch.Generator().manual_seed(2)
    kv = make_paged_kv([5, 17], 8, 2, 16, dtype, "cpu", gen)
    q = make_query(2, 4, 16, dtype, "cpu", gen)
    out = reference.paged_decode_attention(
        q, kv.k_cache, kv.v_cache, kv.block_table, kv.seq_lens, 0.25
    )
    assert out.dtype == dtype
    loop = reference.paged_decode_attention_loop(
        q, kv.k_cache, kv.v_cache, kv.block_table, kv.seq_lens, 0.25
    )
    assert_close(out, loop, dtype)


def test_decode_single_token_is_value():
    """With one token of context the output is exactly that token's value row, per KV head."""
    gen = torch.Generator().manual_seed(3)
    kv = make_paged_kv([1], 4, 2, 8, F32, "cpu", gen)
    q = make_query(1, 6, 8, F32, "cpu", gen)
    out = reference.paged_decode_attention(
        q, kv.k_cache, kv.v_cache, kv.block_table, kv.seq_lens, 1.0
    )
    v = kv.v_cache[int(kv.block_table[0, 0]), 0]  # [Hkv, D]
    torch.testing.assert_close(out[0], v.repeat_interleave(3, dim=0))


def test_extend_equals_decode_token_by_token():
    """Extend over n new tokens == n decode steps, each at its own position (causal,
    bottom-right aligned)."""
    gen = torch.Generator().manual_seed(4)
    P, Hq, Hkv, D = 4, 6, 2, 16
    seqs = [(5, 6), (0, 3), (8, 1), (2, 0)]  # (cached prefix, new tokens)
    lens = [a + b for a, b in seqs]
    kv = make_paged_kv(lens, P, Hkv, D, F32, "cpu", gen)
    q_lens = [b for _, b in seqs]
    q = make_query(sum(q_lens), Hq, D, F32, "cpu", gen)
    cu = make_cu_seqlens(q_lens, "cpu")
    out = reference.extend_attention(
        q, kv.k_cache, kv.v_cache, kv.block_table, cu, kv.seq_lens, 0.3
    )
    for b, (prefix, new) in enumerate(seqs):
        for j in range(new):
            row = int(cu[b]) + j
            step = reference.paged_decode_attention_loop(
                q[row : row + 1], kv.k_cache, kv.v_cache, kv.block_table[b : b + 1],
                torch.tensor([prefix + j + 1], dtype=torch.int32), 0.3,
            )  # fmt: skip
            assert_close(out[row : row + 1], step, F32)


def test_extend_all_single_tokens_takes_batched_path():
    gen = torch.Generator().manual_seed(5)
    kv = make_paged_kv([1, 4, 9], 4, 1, 16, F32, "cpu", gen)
    q = make_query(3, 3, 16, F32, "cpu", gen)
    cu = make_cu_seqlens([1, 1, 1], "cpu")
    ext = reference.extend_attention(
        q, kv.k_cache, kv.v_cache, kv.block_table, cu, kv.seq_lens, 0.5
    )
    dec = reference.paged_decode_attention_loop(
        q, kv.k_cache, kv.v_cache, kv.block_table, kv.seq_lens, 0.5
    )
    assert_close(ext, dec, F32)


def test_store_kv_skips_minus_one_and_casts():
    gen = torch.Generator().manual_seed(6)
    kv = make_paged_kv([8], 4, 2, 8, torch.float16, "cpu", gen)
    before_k = kv.k_cache.clone()
    k = torch.randn(3, 2, 8, generator=gen)
    v = torch.randn(3, 2, 8, generator=gen)
    slots = torch.tensor([5, -1, 0])
    reference.store_kv(k, v, kv.k_cache, kv.v_cache, slots)
    assert torch.equal(kv.k_cache[1, 1], k[0].half()) and torch.equal(kv.v_cache[0, 0], v[2].half())
    changed = (kv.k_cache != before_k).flatten(1).any(1).nonzero().flatten().tolist()
    assert changed == [0, 1]  # pages 0 and 1 only
    kv.k_cache[1, 1], kv.k_cache[0, 0] = before_k[1, 1], before_k[0, 0]
    assert torch.equal(kv.k_cache, before_k)


def test_reference_poisoned_output_is_overwritten(monkeypatch):
    """The reference allocates its output: make torch.empty_like return NaN to prove every
    element is written (decode batches in chunks, extend skips empty sequences)."""
    real = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda t, **kw: nan_like(real(t, **kw)))
    gen = torch.Generator().manual_seed(7)
    kv = make_paged_kv([3, 9, 1], 4, 2, 8, F32, "cpu", gen)
    q = make_query(3, 4, 8, F32, "cpu", gen)
    out = reference.paged_decode_attention(
        q, kv.k_cache, kv.v_cache, kv.block_table, kv.seq_lens, 0.3
    )
    assert not out.isnan().any()
    cu = make_cu_seqlens([2, 0, 1], "cpu")
    q2 = make_query(3, 4, 8, F32, "cpu", gen)
    lens = torch.tensor([3, 9, 1], dtype=torch.int32)
    out = reference.extend_attention(q2, kv.k_cache, kv.v_cache, kv.block_table, cu, lens, 0.3)
    assert not out.isnan().any()
    assert math.isfinite(float(out.sum()))
