"""Sliding-window attention (``window``): the reference against a per-query statement of the
convention and against transformers' own mask function; the "cpu" backend and the public
functions against the reference for windows of 1, shorter than, equal to and longer than the
context, decode and extend over cached prefixes, ragged batches; flash-attn's argument mapping.
(The Triton kernels' window cases are in triton_cases.py, the GPU ones in test_gpu.py.)"""

from __future__ import annotations

import pytest
import torch

import radixray.kernels as K
from radixray.kernels import backends, cpu, flash_attn, reference
from tests.kernels.cases import (
    TOLERANCE,
    assert_close,
    make_cu_seqlens,
    make_paged_kv,
    make_query,
)

F32 = torch.float32
# a ragged batch: one token, page edges (P = 4), a long context
LENS = [1, 3, 4, 5, 13, 40]


def _naive(q, kv, q_lens, scale, window):
    """Each query alone: softmax over exactly the keys at positions (p - window, p]."""
    P, Hkv = kv.k_cache.shape[1], kv.k_cache.shape[2]
    group = q.shape[1] // Hkv
    out = torch.empty_like(q)
    row = 0
    for b, n in enumerate(q_lens):
        L = int(kv.seq_lens[b])
        k = reference.gather_kv(kv.k_cache, kv.block_table[b, : -(-L // P)], L)
        v = reference.gather_kv(kv.v_cache, kv.block_table[b, : -(-L // P)], L)
        for p in range(L - n, L):
            keys = (
                list(range(p + 1)) if window is None else list(range(max(0, p - window + 1), p + 1))
            )
            for h in range(q.shape[1]):
                kh, vh = k[keys, h // group], v[keys, h // group]
                w = torch.softmax(kh @ q[row, h] * scale, dim=0)
                out[row, h] = w @ vh
            row += 1
    return out


def _windows(lens):
    """1, shorter than most contexts, equal to the longest, longer than every one, and None."""
    return [1, 3, 7, max(lens), max(lens) + 5, None]


@pytest.mark.parametrize("window", _windows(LENS))
def test_reference_decode_and_extend_match_the_per_query_statement(window):
    gen = torch.Generator().manual_seed(7)
    kv = make_paged_kv(LENS, 4, 2, 16, F32, "cpu", gen)
    q = make_query(len(LENS), 6, 16, F32, "cpu", gen)
    expected = _naive(q, kv, [1] * len(LENS), 0.25, window)
    args = (q, kv.k_cache, kv.v_cache, kv.block_table, kv.seq_lens, 0.25)
    assert_close(reference.paged_decode_attention(*args, window), expected, F32)
    assert_close(reference.paged_decode_attention_loop(*args, window), expected, F32)
    # extend: prefills over a cached prefix, a cold prefill, a decode row (mixed batch)
    q_lens = [1, 3, 1, 5, 9, 40]
    qx = make_query(sum(q_lens), 6, 16, F32, "cpu", gen)
    cu = make_cu_seqlens(q_lens, "cpu")
    got = reference.extend_attention(
        qx, kv.k_cache, kv.v_cache, kv.block_table, cu, kv.seq_lens, 0.25, window
    )
    assert_close(got, _naive(qx, kv, q_lens, 0.25, window), F32)


def test_window_convention_is_transformers_sliding_window():
    """The reference's mask is transformers' causal mask and sliding_window_overlay: key j is
    kept for query i when j <= i and i - j < sliding_window (Mistral, Gemma 3)."""
    mu = pytest.importorskip("transformers.masking_utils")
    L, W = 12, 4
    hf = mu.and_masks(mu.causal_mask_function, mu.sliding_window_overlay(W))
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    expected = hf(torch.tensor(0), torch.tensor(0), i, j)
    # the reference's mask, read off its output: one-hot values show which keys a query mixes
    q = torch.zeros(L, 1, 1)  # uniform scores: every visible key weighs the same
    k = torch.zeros(L, 1, 1)
    v = torch.eye(L)[:, None, :]  # key j's value is the one-hot e_j
    probs = reference._attend(q, k, v, 1.0, 0, W)[:, 0, :]  # [query, key]
    assert torch.equal(probs > 0, expected)
    assert int(expected.sum(1).max()) == W  # the last W tokens, the query's own included


@pytest.mark.parametrize("window", _windows(LENS))
@pytest.mark.parametrize(("Hq", "Hkv", "P"), [(4, 4, 1), (6, 2, 4), (8, 1, 16)])
def test_cpu_backend_matches_reference(window, Hq, Hkv, P):
    """Decode rows and prefills over cached prefixes in one step, skipped and stored slots, the
    plan built once and used for several windows (as the layers of one model)."""
    gen = torch.Generator().manual_seed(P + Hq)
    lens = LENS + [3 * P + 2]
    q_lens = [1, 2, 1, 5, 1, 40, 3 * P + 2]
    kv = make_paged_kv(lens, P, Hkv, 16, F32, "cpu", gen)
    q = make_query(sum(q_lens), Hq, 16, F32, "cpu", gen)
    cu = make_cu_seqlens(q_lens, "cpu")
    slots = torch.full((sum(q_lens),), -1, dtype=torch.int64)
    ref, fast = (K.make_backend(n, "cpu", F32, P, 16) for n in ("torch", "cpu"))
    ref_plan = ref.prepare(slots, kv.block_table, cu, kv.seq_lens, max(q_lens))
    fast_plan = fast.prepare(slots, kv.block_table, cu, kv.seq_lens, max(q_lens))
    for w in (window, None, window):  # a window layer, a full layer, the window again
        expected = ref.attend(ref_plan, q, kv.k_cache, kv.v_cache, 0.25, w)
        out = fast.attend(fast_plan, q, kv.k_cache, kv.v_cache, 0.25, w)
        torch.testing.assert_close(out, expected, **TOLERANCE[F32])
        assert_close(out, _naive(q, kv, q_lens, 0.25, w), F32)


@pytest.mark.parametrize("window", [1, 5, 64])
def test_cpu_decode_only_gathers_the_window(window):
    """A windowed decode step reads only the pages holding the window, whatever the context."""
    P, ctx = 4, [100, 37, 2]
    table = torch.arange(sum(-(-n // P) for n in ctx) + 3, dtype=torch.int32)
    block_table = torch.full((3, 30), -1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(ctx):
        block_table[b, : -(-n // P)] = table[used : used + -(-n // P)]
        used += -(-n // P)
    plan = cpu.plan(
        block_table, make_cu_seqlens([1, 1, 1], "cpu"), torch.tensor(ctx, dtype=torch.int32),
        torch.full((3,), -1), P,
    ).for_window(window)  # fmt: skip
    longest = max(min(n, window) + P - 1 for n in ctx)  # window plus at most a partial page
    assert all(g.length <= longest for g in plan.decode)
    assert plan.for_window(window) is plan.for_window(window)  # built once per step


@pytest.mark.parametrize("window", [1, 4, 9, 100, None])
def test_public_functions_take_a_window(window):
    gen = torch.Generator().manual_seed(3)
    kv = make_paged_kv([9, 2, 17], 4, 2, 16, F32, "cpu", gen)
    q = make_query(3, 4, 16, F32, "cpu", gen)
    args = (q, kv.k_cache, kv.v_cache, kv.block_table, kv.seq_lens, 0.25)
    expected = _naive(q, kv, [1, 1, 1], 0.25, window)
    for backend in ("cpu", "torch"):
        assert_close(K.paged_decode_attention(*args, backend, window=window), expected, F32)
        cu = make_cu_seqlens([1, 1, 1], "cpu")
        ext = K.extend_attention(
            q, kv.k_cache, kv.v_cache, kv.block_table, cu, kv.seq_lens, 0.25, backend,
            max_seqlen_q=1, window=window,
        )  # fmt: skip
        assert_close(ext, expected, F32)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "512"])
def test_a_bad_window_is_refused_with_its_value(bad):
    gen = torch.Generator().manual_seed(1)
    kv = make_paged_kv([3], 4, 2, 16, F32, "cpu", gen)
    q = make_query(1, 4, 16, F32, "cpu", gen)
    for backend in ("cpu", "torch"):
        with pytest.raises(ValueError, match=r"window must be None or an int >= 1.*got"):
            K.paged_decode_attention(
                q, kv.k_cache, kv.v_cache, kv.block_table, kv.seq_lens, 1.0, backend, window=bad
            )
    with pytest.raises(ValueError, match="window must be"):
        flash_attn.window_size(bad)


def test_flash_attn_window_size_mapping():
    """flash-attn keeps keys in [i - left, i + right]; ours are (p - W, p]: left = W - 1."""
    assert flash_attn.window_size(None) == (-1, -1)
    assert flash_attn.window_size(1) == (0, 0)  # the query's own key only
    assert flash_attn.window_size(512) == (511, 0)
    assert flash_attn._window_kwargs(None) == {}  # full attention: the call is unchanged
    assert flash_attn._window_kwargs(4096) == {"window_size": (4095, 0)}
    # the mapped range is exactly the reference's: for p and W, [p - left, p] == (p - W, p]
    for W in (1, 2, 7):
        left, right = flash_attn.window_size(W)
        for p in range(10):
            fa = {j for j in range(p - left, p + right + 1) if 0 <= j <= p}
            assert fa == {j for j in range(10) if j <= p and p - j < W}


def test_flash_attn_passes_window_size_to_the_library(monkeypatch):
    """The adapter's call, with the library replaced by a recorder (flash-attn needs CUDA)."""
    calls = []
    lib = flash_attn._Lib(lambda **kw: calls.append(kw) or kw["q"], "fake", True, 16)
    monkeypatch.setattr(flash_attn, "_require", lambda q, k_cache: lib)
    gen = torch.Generator().manual_seed(2)
    kv = make_paged_kv([5, 9], 16, 2, 16, F32, "cpu", gen)
    q = make_query(2, 4, 16, F32, "cpu", gen)
    args = (q, kv.k_cache, kv.v_cache, kv.block_table, kv.seq_lens, 0.25)
    flash_attn.paged_decode_attention(*args)
    flash_attn.paged_decode_attention(*args, window=8)
    cu = make_cu_seqlens([1, 1], "cpu")
    ext = (q, kv.k_cache, kv.v_cache, kv.block_table, cu, kv.seq_lens, 0.25)
    flash_attn.extend_attention(*ext, window=3)
    assert "window_size" not in calls[0]
    assert calls[1]["window_size"] == (7, 0) and calls[2]["window_size"] == (2, 0)
    assert all(c["causal"] for c in calls)
    # and through the backend object, as a model's layer calls it
    backend = backends.FlashAttnBackend("cpu", F32, 16, 16)
    no_store = torch.full((2,), -1)
    plan = backend.prepare(no_store, kv.block_table, cu, kv.seq_lens, 1)
    backend.attend(plan, q, kv.k_cache, kv.v_cache, 0.25, window=512)
    backend.attend(plan, q, kv.k_cache, kv.v_cache, 0.25)
    backend.decode(*args, window=2)
    assert calls[3]["window_size"] == (511, 0) and "window_size" not in calls[4]
    assert calls[5]["window_size"] == (1, 0)
