"""The fast backends at realistic sizes on CUDA (skipped without it): Llama-like GQA 32/8 heads,
contexts in the thousands, every supported head dim, page sizes 1..256."""

from __future__ import annotations

import pytest
import torch

import radixray.kernels as K
from radixray.kernels import flash_attn, reference
from tests.kernels.cases import (
    assert_close,
    make_cu_seqlens,
    make_paged_kv,
    make_query,
    nan_like,
)

pytestmark = pytest.mark.gpu
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def _lens(gen, batch: int, max_len: int, page_size: int) -> list[int]:
    lens = torch.randint(1, max_len + 1, (batch,), generator=gen).tolist()
    lens[:4] = [1, page_size - 1 or 1, page_size, page_size + 1][: len(lens)]
    return lens


@pytest.mark.parametrize(
    "P,Hq,Hkv,D,dtype",
    [
        (16, 32, 8, 128, BF16),
        (16, 32, 8, 128, F16),
        (16, 32, 8, 128, F32),
        (1, 8, 8, 64, BF16),
        (32, 24, 8, 80, BF16),
        (64, 12, 4, 96, F16),
        (256, 16, 2, 256, BF16),
        (16, 9, 3, 64, F32),
    ],
)
def test_triton_decode_realistic(P, Hq, Hkv, D, dtype):
    from radixray.kernels.triton_decode import paged_decode_attention as triton_decode

    gen = torch.Generator().manual_seed(P + D)
    kv = make_paged_kv(_lens(gen, 24, 3000, P), P, Hkv, D, dtype, "cuda", gen)
    q = make_query(24, Hq, D, dtype, "cuda", gen)
    args = (q, kv.k_cache, kv.v_cache, kv.block_table, kv.seq_lens, D**-0.5)
    expected = reference.paged_decode_attention(*args)
    for splits in (None, 1, 7):
        out = nan_like(q)
        triton_decode(*args, num_splits=splits, out=out)
        assert_close(out, expected, dtype)


def test_triton_decode_long_context_small_batch():
    """batch 1 x 32k tokens: the case split-KV exists for."""
    from radixray.kernels.triton_decode import paged_decode_attention as triton_decode

    gen = torch.Generator().manual_seed(1)
    kv = make_paged_kv([32768, 17], 16, 8, 128, BF16, "cuda", gen)
    q = make_query(2, 32, 128, BF16, "cuda", gen)
    args = (q, kv.k_cache, kv.v_cache, kv.block_table, kv.seq_lens, 128**-0.5)
    out = nan_like(q)
    triton_decode(*args, out=out)
    assert_close(out, reference.paged_decode_attention(*args), BF16)


@pytest.mark.parametrize(
    "P,Hq,Hkv,D,dtype",
    [(16, 32, 8, 128, BF16), (1, 8, 8, 64, F16), (64, 12, 4, 96, F32), (256, 16, 2, 256, BF16)],
)
def test_triton_extend_realistic(P, Hq, Hkv, D, dtype):
    from radixray.kernels.triton_extend import extend_attention as triton_extend

    gen = torch.Generator().manual_seed(P + D + 1)
    seqs = [(0, 517), (1000, 300), (P, 1), (3 * P - 1, P + 1), (2000, 64), (5, 0)]
    lens = [a + b for a, b in seqs]
    q_lens = [b for _, b in seqs]
    kv = make_paged_kv(lens, P, Hkv, D, dtype, "cuda", gen)
    q = make_query(sum(q_lens), Hq, D, dtype, "cuda", gen)
    cu = make_cu_seqlens(q_lens, "cuda")
    args = (q, kv.k_cache, kv.v_cache, kv.block_table, cu, kv.seq_lens, D**-0.5)
    expected = reference.extend_attention(*args)
    out = nan_like(q)
    triton_extend(*args, out=out)
    assert_close(out, expected, dtype)
    out = nan_like(q)
    triton_extend(*args, out=out, max_seqlen_q=max(q_lens))
    assert_close(out, expected, dtype)


def test_triton_store_kv_realistic():
    from radixray.kernels.triton_store import store_kv as triton_store

    gen = torch.Generator().manual_seed(2)
    kv = make_paged_kv([4096, 300], 16, 8, 128, BF16, "cuda", gen)
    num_slots = kv.k_cache.shape[0] * 16
    slots = torch.randperm(num_slots, generator=gen)[:2000]
    slots[::7] = -1
    slots = slots.cuda()
    k = torch.randn(2000, 8, 128, generator=gen).cuda()
    v = torch.randn(2000, 8, 128, generator=gen).cuda()
    k_exp, v_exp = kv.k_cache.clone(), kv.v_cache.clone()
    reference.store_kv(k, v, k_exp, v_exp, slots)
    triton_store(k, v, kv.k_cache, kv.v_cache, slots)
    assert torch.equal(kv.k_cache, k_exp) and torch.equal(kv.v_cache, v_exp)


@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("T,H", [(1, 576), (64, 4096), (4096, 576), (300, 8192)])
def test_triton_rms_norm_realistic(dtype, T, H):
    """The fused RMSNorm (kernels/triton_norm.py) against the model's eight-op PyTorch form,
    within two units in the last place, compiled for this GPU."""
    from radixray.kernels.triton_norm import rms_norm

    gen = torch.Generator().manual_seed(T + H)
    x = (torch.randn(T, H, generator=gen) * 4).to("cuda", dtype)
    w = (1 + torch.randn(H, generator=gen) / 4).to("cuda", dtype)
    xf = x.float()
    want = w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dtype)
    torch.testing.assert_close(rms_norm(x, w, 1e-5).float(), want.float(), rtol=2**-6, atol=1e-6)


def test_auto_backend_on_cuda_is_fast():
    gen = torch.Generator().manual_seed(3)
    kv = make_paged_kv([100, 7], 16, 2, 64, BF16, "cuda", gen)
    q = make_query(2, 4, 64, BF16, "cuda", gen)
    assert K.resolve_backend(None, q, kv.k_cache) in ("flash_attn", "triton")
    kv32 = make_paged_kv([100, 7], 16, 2, 64, F32, "cuda", gen)
    assert K.resolve_backend(None, q.float(), kv32.k_cache) == "triton"  # flash-attn: no fp32


@pytest.mark.skipif(not flash_attn.available(), reason="no vllm_flash_attn / flash_attn")
@pytest.mark.parametrize("D", [64, 128])
def test_flash_attn_backend_matches_reference(D):
    P = 256 if not flash_attn._load().has_seqused_k else 16
    gen = torch.Generator().manual_seed(D)
    lens = [1, P - 1, P, P + 1, 2500]
    kv = make_paged_kv(lens, P, 8, D, BF16, "cuda", gen, pad_value=0)
    q = make_query(len(lens), 32, D, BF16, "cuda", gen)
    args = (q, kv.k_cache, kv.v_cache, kv.block_table, kv.seq_lens, D**-0.5)
    assert_close(
        K.paged_decode_attention(*args, backend="flash_attn"),
        reference.paged_decode_attention(*args),
        BF16,
    )
    q_lens = [1, 5, P, 1, 300]
    qe = make_query(sum(q_lens), 32, D, BF16, "cuda", gen)
    cu = make_cu_seqlens(q_lens, "cuda")
    eargs = (qe, kv.k_cache, kv.v_cache, kv.block_table, cu, kv.seq_lens, D**-0.5)
    assert_close(
        K.extend_attention(*eargs, backend="flash_attn"), reference.extend_attention(*eargs), BF16
    )


# Sliding windows at real sizes: Gemma 3's 512 and 1,024, Mistral's 4,096 (longer than most of
# these contexts), and one shorter than a page.
@pytest.mark.parametrize(
    "P,Hq,Hkv,D,dtype,window",
    [
        (16, 32, 8, 128, BF16, 512),
        (16, 8, 4, 256, BF16, 1024),
        (1, 8, 8, 64, F16, 4096),
        (64, 12, 4, 96, F32, 7),
    ],
)
def test_triton_sliding_window_realistic(P, Hq, Hkv, D, dtype, window):
    from radixray.kernels.triton_decode import paged_decode_attention as triton_decode
    from radixray.kernels.triton_extend import extend_attention as triton_extend

    gen = torch.Generator().manual_seed(P + D + window)
    kv = make_paged_kv(_lens(gen, 24, 3000, P), P, Hkv, D, dtype, "cuda", gen)
    q = make_query(24, Hq, D, dtype, "cuda", gen)
    args = (q, kv.k_cache, kv.v_cache, kv.block_table, kv.seq_lens, D**-0.5)
    expected = reference.paged_decode_attention(*args, window)
    for splits in (None, 1, 7):
        out = nan_like(q)
        triton_decode(*args, num_splits=splits, out=out, window=window)
        assert_close(out, expected, dtype)

    seqs = [(0, 517), (1000, 300), (P, 1), (3 * P - 1, P + 1), (2000, 64), (5, 0)]
    kv = make_paged_kv([a + b for a, b in seqs], P, Hkv, D, dtype, "cuda", gen)
    q_lens = [b for _, b in seqs]
    qe = make_query(sum(q_lens), Hq, D, dtype, "cuda", gen)
    cu = make_cu_seqlens(q_lens, "cuda")
    eargs = (qe, kv.k_cache, kv.v_cache, kv.block_table, cu, kv.seq_lens, D**-0.5)
    out = nan_like(qe)
    triton_extend(*eargs, out=out, max_seqlen_q=max(q_lens), window=window)
    assert_close(out, reference.extend_attention(*eargs, window), dtype)


@pytest.mark.skipif(not flash_attn.available(), reason="no vllm_flash_attn / flash_attn")
@pytest.mark.parametrize("window", [1, 200, 512, 100_000])
def test_flash_attn_sliding_window_matches_reference(window):
    P = 256 if not flash_attn._load().has_seqused_k else 16
    gen = torch.Generator().manual_seed(window)
    lens = [1, P + 1, 700, 2500]
    kv = make_paged_kv(lens, P, 8, 128, BF16, "cuda", gen, pad_value=0)
    q = make_query(len(lens), 32, 128, BF16, "cuda", gen)
    args = (q, kv.k_cache, kv.v_cache, kv.block_table, kv.seq_lens, 128**-0.5)
    assert_close(
        K.paged_decode_attention(*args, backend="flash_attn", window=window),
        reference.paged_decode_attention(*args, window),
        BF16,
    )
    q_lens = [1, 5, 600, 300]
    qe = make_query(sum(q_lens), 32, 128, BF16, "cuda", gen)
    cu = make_cu_seqlens(q_lens, "cuda")
    eargs = (qe, kv.k_cache, kv.v_cache, kv.block_table, cu, kv.seq_lens, 128**-0.5)
    assert_close(
        K.extend_attention(*eargs, backend="flash_attn", window=window),
        reference.extend_attention(*eargs, window),
        BF16,
    )
