"""Triton kernels against the reference, small enough for Triton's CPU interpreter.

Not collected by itself (the name does not start with test_): test_triton.py runs it in a
subprocess with TRITON_INTERPRET=1 when there is no GPU, because Triton decides at import time
(``@triton.jit``) whether a kernel is compiled or interpreted, and that must not leak into the
other test modules. With CUDA it runs compiled, on the GPU.
"""

from __future__ import annotations

import os

import pytest
import torch

import radixray.kernels as K
from radixray.kernels import reference
from tests.kernels.cases import (
    assert_close,
    edge_lengths,
    make_cu_seqlens,
    make_paged_kv,
    make_query,
    nan_like,
)

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
if not INTERPRET and not torch.cuda.is_available():
    pytest.skip("needs CUDA or TRITON_INTERPRET=1", allow_module_level=True)
DEVICE = "cpu" if INTERPRET else "cuda"

from radixray.kernels.triton_decode import paged_decode_attention as triton_decode  # noqa: E402
from radixray.kernels.triton_extend import extend_attention as triton_extend  # noqa: E402
from radixray.kernels.triton_store import store_kv as triton_store  # noqa: E402

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# (page_size, Hq, Hkv, head_dim, dtype, num_splits, block_n): page sizes 1..256, Hq/Hkv 1, 3, 8,
# head dims 16..80 plus one real one (64) and a non power of two (80), every dtype, one split and
# several, BLOCK_N 16 so that a split spans several inner steps (rescaling is exercised).
DECODE_CASES = [
    (1, 2, 2, 16, F32, None, 16),
    (4, 6, 2, 16, F32, 3, 16),
    (16, 8, 1, 32, F32, 1, None),
    (16, 3, 1, 64, F16, 2, 16),
    (8, 4, 4, 80, BF16, 4, 16),
    (2, 16, 2, 32, F16, None, 16),
    (256, 3, 1, 16, BF16, 2, None),
]


@pytest.mark.parametrize("P,Hq,Hkv,D,dtype,num_splits,block_n", DECODE_CASES)
def test_decode(P, Hq, Hkv, D, dtype, num_splits, block_n):
    gen = _gen(P * 1000 + Hq * 10 + D)
    lens = edge_lengths(P, many_pages=1 if P == 256 else 3)
    kv = make_paged_kv(lens, P, Hkv, D, dtype, DEVICE, gen)
    q = make_query(len(lens), Hq, D, dtype, DEVICE, gen)
    scale = D**-0.5
    out = nan_like(q)
    triton_decode(
        q, kv.k_cache, kv.v_cache, kv.block_table, kv.seq_lens, scale,
        num_splits=num_splits, out=out, block_n=block_n,
    )  # fmt: skip
    expected = reference.paged_decode_attention_loop(
        q, kv.k_cache, kv.v_cache, kv.block_table, kv.seq_lens, scale
    )
    assert_close(out, expected, dtype)


# (page_size, Hq, Hkv, head_dim, dtype, [(cached prefix, new tokens) per sequence], block sizes)
EXTEND_CASES = [
    (4, 2, 2, 16, F32, [(0, 9), (3, 1), (4, 4), (5, 0), (7, 21)], (16, 16)),
    (16, 6, 2, 32, F16, [(0, 16), (15, 2), (16, 17), (1, 1)], (16, 16)),
    (1, 8, 1, 16, BF16, [(2, 3), (0, 1), (6, 12)], (16, 16)),
    (8, 3, 1, 64, F32, [(9, 7), (0, 24)], None),
]


@pytest.mark.parametrize("P,Hq,Hkv,D,dtype,seqs,block_sizes", EXTEND_CASES)
def test_extend(P, Hq, Hkv, D, dtype, seqs, block_sizes):
    gen = _gen(P * 1000 + Hq * 10 + D + 7)
    lens = [prefix + new for prefix, new in seqs]
    q_lens = [new for _, new in seqs]
    kv = make_paged_kv(lens, P, Hkv, D, dtype, DEVICE, gen)
    q = make_query(sum(q_lens), Hq, D, dtype, DEVICE, gen)
    cu = make_cu_seqlens(q_lens, DEVICE)
    scale = D**-0.5
    out = nan_like(q)
    triton_extend(
        q, kv.k_cache, kv.v_cache, kv.block_table, cu, kv.seq_lens, scale,
        out=out, block_sizes=block_sizes,
    )  # fmt: skip
    expected = reference.extend_attention(
        q, kv.k_cache, kv.v_cache, kv.block_table, cu, kv.seq_lens, scale
    )
    assert_close(out, expected, dtype)


@pytest.mark.parametrize(
    "P,Hkv,D,src_dtype,cache_dtype",
    [(4, 2, 16, F32, F32), (16, 3, 64, F32, BF16), (1, 1, 80, F16, F16), (256, 2, 32, F32, F16)],
)
def test_store_kv(P, Hkv, D, src_dtype, cache_dtype):
    gen = _gen(P + Hkv + D)
    kv = make_paged_kv([3 * P + 1, P], P, Hkv, D, cache_dtype, DEVICE, gen)
    num_slots = kv.k_cache.shape[0] * P
    T = min(12, num_slots)
    slots = torch.randperm(num_slots, generator=gen)[:T]
    slots[T // 2] = -1  # skipped row
    slots[-1] = num_slots - 1  # the very last slot of the pool
    slots = slots.to(DEVICE)
    k = torch.randn(T, Hkv, D, generator=gen).to(DEVICE, src_dtype)
    v = torch.randn(T, Hkv, D, generator=gen).to(DEVICE, src_dtype)
    k_exp, v_exp = kv.k_cache.clone(), kv.v_cache.clone()
    reference.store_kv(k, v, k_exp, v_exp, slots)
    triton_store(k, v, kv.k_cache, kv.v_cache, slots)
    # a copy and one rounding: bit-exact, and every slot not in slot_mapping is untouched
    assert torch.equal(kv.k_cache, k_exp)
    assert torch.equal(kv.v_cache, v_exp)


def test_non_contiguous_q_and_strided_cache():
    """q sliced from a fused qkv projection and a cache that is one layer of a bigger pool."""
    gen = _gen(11)
    P, Hq, Hkv, D = 4, 4, 2, 16
    lens = [5, 9]
    kv = make_paged_kv(lens, P, Hkv, D, F32, DEVICE, gen)
    pool = torch.randn(2, *kv.k_cache.shape, generator=gen).to(DEVICE)  # [layers, ...]
    pool[1] = kv.k_cache
    k_cache = pool[1]
    qkv = make_query(2, Hq + 2 * Hkv, D, F32, DEVICE, gen)
    q = qkv[:, :Hq]
    assert not q.is_contiguous()
    out = triton_decode(q, k_cache, kv.v_cache, kv.block_table, kv.seq_lens, 0.25, num_splits=2)
    expected = reference.paged_decode_attention_loop(
        q, k_cache, kv.v_cache, kv.block_table, kv.seq_lens, 0.25
    )
    assert_close(out, expected, F32)


def test_public_api_forced_triton():
    """radixray.kernels with backend="triton" (and by environment variable) runs these kernels;
    on CPU the automatic choice stays the CPU fast path even under the interpreter."""
    gen = _gen(5)
    P, Hq, Hkv, D = 4, 6, 2, 16
    lens = [1, 4, 6]
    kv = make_paged_kv(lens, P, Hkv, D, F32, DEVICE, gen)
    q = make_query(3, Hq, D, F32, DEVICE, gen)
    args = (q, kv.k_cache, kv.v_cache, kv.block_table, kv.seq_lens, 0.25)
    expected = reference.paged_decode_attention_loop(*args)
    assert_close(K.paged_decode_attention(*args, backend="triton"), expected, F32)
    cu = make_cu_seqlens([1, 1, 1], DEVICE)
    ext = K.extend_attention(
        q, kv.k_cache, kv.v_cache, kv.block_table, cu, kv.seq_lens, 0.25, backend="triton"
    )
    assert_close(ext, expected, F32)
    if INTERPRET:
        assert K.resolve_backend(None, q, kv.k_cache) == "cpu"  # never the interpreter
    os.environ[K.ENV_VAR] = "triton"  # this subprocess only
    try:
        assert K.resolve_backend(None, q, kv.k_cache) == "triton"
    finally:
        del os.environ[K.ENV_VAR]


def test_triton_backend_object_routes_a_decode_step_and_a_mixed_step():
    """The backend object as the model uses it: one plan per step; a pure decode step (one new
    token per sequence, max_seqlen_q=1) takes the split-KV decode kernel, a mixed one the extend
    kernel; both store through the Triton store and match the reference."""
    gen = _gen(6)
    P, Hq, Hkv, D = 4, 4, 2, 16
    backend = K.make_backend("triton", DEVICE, F32, P, D)
    ref = K.make_backend("torch", DEVICE, F32, P, D)
    for q_lens, lens in (([1, 1], [3, 9]), ([3, 1], [5, 6])):
        kv = make_paged_kv(lens, P, Hkv, D, F32, DEVICE, gen)
        T = sum(q_lens)
        q = make_query(T, Hq, D, F32, DEVICE, gen)
        k_new = torch.randn(T, Hkv, D, generator=gen).to(DEVICE)
        cu = make_cu_seqlens(q_lens, DEVICE)
        slots = [
            int(kv.block_table[b, p // P]) * P + p % P
            for b, (n, L) in enumerate(zip(q_lens, lens, strict=True))
            for p in range(L - n, L)
        ]
        slot_mapping = torch.tensor(slots, device=DEVICE)
        outs = []
        for impl in (backend, ref):
            kc, vc = kv.k_cache.clone(), kv.v_cache.clone()
            plan = impl.prepare(slot_mapping, kv.block_table, cu, kv.seq_lens, max(q_lens))
            impl.store(plan, k_new, k_new, kc, vc)
            outs.append((impl.attend(plan, q, kc, vc, 0.25), kc))
        assert backend.prepare(
            slot_mapping, kv.block_table, cu, kv.seq_lens, max(q_lens)
        ).decode_only == (max(q_lens) == 1)
        assert torch.equal(outs[0][1], outs[1][1])
        assert_close(outs[0][0], outs[1][0], F32)


# Sliding windows (names avoid the other groups' -k words): 1, shorter than most contexts, equal to
# the longest, longer than all, on a ragged batch; BLOCK_N 16 so that windows start mid-block and
# whole blocks are skipped; several splits.
WINDOWS = [1, 6, 30, 41]


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("dtype,num_splits", [(F32, 3), (F16, 1)])
def test_sliding_window_one_query(window, dtype, num_splits):
    gen = _gen(window)
    P, Hq, Hkv, D = 4, 4, 2, 16
    lens = [1, 5, 13, 30]
    kv = make_paged_kv(lens, P, Hkv, D, dtype, DEVICE, gen)
    q = make_query(len(lens), Hq, D, dtype, DEVICE, gen)
    args = (q, kv.k_cache, kv.v_cache, kv.block_table, kv.seq_lens, D**-0.5)
    out = nan_like(q)
    triton_decode(*args, num_splits=num_splits, out=out, block_n=16, window=window)
    assert_close(out, reference.paged_decode_attention_loop(*args, window), dtype)


@pytest.mark.parametrize("window", WINDOWS)
def test_sliding_window_prefill(window):
    """Prefills over cached prefixes, a cold one and a one-token row; BLOCK_M 16, so with a small
    window the later rows of a block see nothing in its first key steps."""
    gen = _gen(window + 100)
    P, Hq, Hkv, D = 4, 4, 2, 16
    seqs = [(0, 9), (5, 3), (20, 1), (12, 29)]
    lens = [prefix + new for prefix, new in seqs]
    q_lens = [new for _, new in seqs]
    kv = make_paged_kv(lens, P, Hkv, D, F32, DEVICE, gen)
    q = make_query(sum(q_lens), Hq, D, F32, DEVICE, gen)
    cu = make_cu_seqlens(q_lens, DEVICE)
    args = (q, kv.k_cache, kv.v_cache, kv.block_table, cu, kv.seq_lens, D**-0.5)
    out = nan_like(q)
    triton_extend(*args, out=out, block_sizes=(16, 16), window=window)
    assert_close(out, reference.extend_attention(*args, window), F32)


def test_sliding_window_backend_object():
    """The Triton backend takes the window per attend call: a pure decode step (split-KV kernel)
    and a mixed step (extend kernel), each with a window layer and a full layer."""
    gen = _gen(9)
    P, Hq, Hkv, D = 4, 4, 2, 16
    backend = K.make_backend("triton", DEVICE, F32, P, D)
    ref = K.make_backend("torch", DEVICE, F32, P, D)
    for q_lens, lens in (([1, 1], [3, 19]), ([6, 1], [17, 9])):
        kv = make_paged_kv(lens, P, Hkv, D, F32, DEVICE, gen)
        q = make_query(sum(q_lens), Hq, D, F32, DEVICE, gen)
        cu = make_cu_seqlens(q_lens, DEVICE)
        no_store = torch.full((sum(q_lens),), -1, device=DEVICE)
        plans = [
            impl.prepare(no_store, kv.block_table, cu, kv.seq_lens, max(q_lens))
            for impl in (backend, ref)
        ]
        for window in (5, None):
            got = backend.attend(plans[0], q, kv.k_cache, kv.v_cache, 0.25, window)
            want = ref.attend(plans[1], q, kv.k_cache, kv.v_cache, 0.25, window)
            assert_close(got, want, F32)


# --- RMSNorm (triton_norm.py) against the model's PyTorch RMSNorm ----------------------------


def _torch_rms_norm(x, weight, eps):
    """layers.RMSNorm's 16-bit path: normalise in float32, cast, scale in the model dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


@pytest.mark.parametrize("dtype", [F16, BF16])
@pytest.mark.parametrize("T,H", [(1, 16), (5, 64), (33, 576), (3, 1000)])
def test_rms_norm(dtype, T, H):
    from radixray.kernels.triton_norm import rms_norm

    gen = _gen(T + H)
    x = (torch.randn(T, H, generator=gen) * 4).to(DEVICE, dtype)
    w = (1 + torch.randn(H, generator=gen) / 4).to(DEVICE, dtype)
    got, want = rms_norm(x, w, 1e-5), _torch_rms_norm(x, w, 1e-5)
    assert got.dtype == dtype and got.shape == x.shape
    # within two units in the last place: another reduction order, an rsqrt's last bit, and
    # under the interpreter a truncating float32 -> bfloat16 cast
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-6, atol=1e-6)


def test_rms_norm_rows_of_a_strided_view():
    """q's heads sliced from a fused qkv projection: each head a row (Qwen 3's q_norm)."""
    from radixray.kernels.triton_norm import rms_norm

    gen = _gen(7)
    qkv = torch.randn(6, 3 * 32 + 2 * 32, generator=gen).to(DEVICE, F16)
    q = qkv[:, : 3 * 32].view(6, 3, 32)  # rows of 32 at two strides: copied to one
    w = torch.randn(32, generator=gen).to(DEVICE, F16)
    got = rms_norm(q, w, 1e-6)
    torch.testing.assert_close(got.float(), _torch_rms_norm(q, w, 1e-6).float(), rtol=2**-6, atol=0)
    with pytest.raises(ValueError, match=r"weight must be \[32\] torch.float16"):
        rms_norm(q, w.float(), 1e-6)


@pytest.mark.parametrize("dtype", [F16, BF16])
@pytest.mark.parametrize("T,H", [(1, 16), (5, 64), (33, 576)])
def test_add_rms_norm(dtype, T, H):
    """The residual add and the norm in one kernel (triton_norm.add_rms_norm) against the
    model's PyTorch add and RMSNorm."""
    from radixray.kernels.triton_norm import add_rms_norm

    gen = _gen(3 * T + H)
    x = (torch.randn(T, H, generator=gen) * 4).to(DEVICE, dtype)
    r = (torch.randn(T, H, generator=gen) * 4).to(DEVICE, dtype)
    w = (1 + torch.randn(H, generator=gen) / 4).to(DEVICE, dtype)
    total, normed = add_rms_norm(x, r, w, 1e-5)
    want = x + r
    # the sum within one unit in the last place (the interpreter's cast truncates; on a GPU
    # it rounds, as PyTorch's add), the norm of that sum within two, as rms_norm's
    torch.testing.assert_close(total.float(), want.float(), rtol=2**-7, atol=1e-6)
    torch.testing.assert_close(
        normed.float(), _torch_rms_norm(total, w, 1e-5).float(), rtol=2**-6, atol=1e-6
    )
    with pytest.raises(ValueError, match="residual must be"):
        add_rms_norm(x, r[:, :-1], w, 1e-5)


@pytest.mark.parametrize("dtype", [F16, BF16])
@pytest.mark.parametrize("T,inter", [(1, 8), (4, 100), (3, 1536)])
def test_silu_and_mul(dtype, T, inter):
    """The gated MLP's activation in one kernel (triton_act.silu_and_mul) against PyTorch's
    SiLU and product, each rounded to the dtype: within two units in the last place."""
    from radixray.kernels.triton_act import silu_and_mul

    gen = _gen(T + inter)
    gate_up = (torch.randn(T, 2 * inter, generator=gen) * 3).to(DEVICE, dtype)
    gate, up = gate_up.split(inter, dim=-1)
    want = torch.nn.functional.silu(gate) * up
    got = silu_and_mul(gate_up)
    assert got.dtype == dtype and got.shape == (T, inter)
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-6, atol=1e-5)
    with pytest.raises(ValueError, match="gate_up must be"):
        silu_and_mul(gate_up[:, :-1])
