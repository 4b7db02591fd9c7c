"""The CPU fast path of the "torch" backend (kernels/cpu.py) against the reference: mixed
prefill + decode batches, MHA and GQA, odd lengths, page edges, several page sizes, decode rows
of very different lengths (several padded groups), cached prefixes and skipped slots."""

import pytest
import torch

import radixray.kernels as K
from radixray.kernels import cpu

from .cases import TOLERANCE, edge_lengths, make_cu_seqlens, make_paged_kv, make_query


def run_both(q_lens, ctx_lens, P, Hq, Hkv, D=32, seed=0, skip_rows=()):
    gen = torch.Generator().manual_seed(seed)
    kv = make_paged_kv(ctx_lens, P, Hkv, D, torch.float32, "cpu", gen)
    T = sum(q_lens)
    q = make_query(T, Hq, D, torch.float32, "cpu", gen)
    k_new = torch.randn(T, Hkv, D, generator=gen)
    v_new = torch.randn(T, Hkv, D, generator=gen)
    cu = make_cu_seqlens(q_lens, "cpu")
    slots = []
    for b, (n, L) in enumerate(zip(q_lens, ctx_lens, strict=True)):
        for pos in range(L - n, L):
            slots.append(int(kv.block_table[b, pos // P]) * P + pos % P)
    slot_mapping = torch.tensor(slots, dtype=torch.int64)
    for r in skip_rows:
        slot_mapping[r] = -1
    results = []
    for fast in (False, True):
        kc, vc = kv.k_cache.clone(), kv.v_cache.clone()
        plan = cpu.plan(kv.block_table, cu, kv.seq_lens, slot_mapping, P) if fast else None
        K.store_kv(k_new, v_new, kc, vc, slot_mapping, backend="torch", plan=plan)
        out = K.extend_attention(
            q, kc, vc, kv.block_table, cu, kv.seq_lens, D**-0.5, backend="torch", plan=plan
        )
        results.append((out, kc, vc))
    return results


@pytest.mark.parametrize("P", [1, 4, 16])
@pytest.mark.parametrize(("Hq", "Hkv"), [(4, 4), (9, 3), (8, 1)])
def test_mixed_batch_matches_reference(P, Hq, Hkv):
    ctx = edge_lengths(P) + [5 * P + 3, 2]
    # decode rows, a cold prefill, prefills over a cached prefix, and a one-token context
    q_lens = [1 if i % 2 == 0 else max(1, ctx[i] // 2) for i in range(len(ctx))]
    q_lens[-1] = ctx[-1]  # cold prefill of the whole context
    (ref, kr, vr), (fast, kf, vf) = run_both(q_lens, ctx, P, Hq, Hkv, seed=P + Hq)
    assert torch.equal(kr, kf) and torch.equal(vr, vf)
    torch.testing.assert_close(fast, ref, **TOLERANCE[torch.float32])


def test_decode_of_very_different_lengths_uses_several_groups():
    ctx = [3, 700, 17, 2000, 1, 64, 65, 1300]
    gen_plan = cpu.plan(
        torch.zeros(len(ctx), 2000, dtype=torch.int32),
        make_cu_seqlens([1] * len(ctx), "cpu"),
        torch.tensor(ctx, dtype=torch.int32),
        torch.zeros(len(ctx), dtype=torch.int64),
        16,
    )
    assert len(gen_plan.decode) > 1
    (ref, *_), (fast, *_) = run_both([1] * len(ctx), ctx, 16, 9, 3)
    torch.testing.assert_close(fast, ref, **TOLERANCE[torch.float32])


@pytest.mark.parametrize("ctx", [[1], [16], [33, 33, 33]])
def test_pure_decode_of_equal_lengths(ctx):
    (ref, *_), (fast, *_) = run_both([1] * len(ctx), ctx, 16, 9, 3)
    torch.testing.assert_close(fast, ref, **TOLERANCE[torch.float32])


def test_skipped_slots_are_not_stored():
    (ref, kr, vr), (fast, kf, vf) = run_both([4, 1], [9, 20], 4, 4, 2, skip_rows=(1, 3))
    assert torch.equal(kr, kf) and torch.equal(vr, vf)
    torch.testing.assert_close(fast, ref, **TOLERANCE[torch.float32])


def test_plan_only_for_automatic_float32_cpu(monkeypatch):
    kv = make_paged_kv([5], 4, 2, 8, torch.float32, "cpu", torch.Generator().manual_seed(0))
    args = (kv.block_table, make_cu_seqlens([5], "cpu"), kv.seq_lens, torch.arange(5))
    monkeypatch.delenv(K.ENV_VAR, raising=False)
    assert K.cpu_plan(*args, kv.k_cache) is not None
    assert K.cpu_plan(*args, kv.k_cache, backend="auto") is not None
    assert K.cpu_plan(*args, kv.k_cache, backend="torch") is None  # named: the reference
    assert K.cpu_plan(*args, kv.k_cache.double()) is None
    monkeypatch.setenv(K.ENV_VAR, "torch")
    assert K.cpu_plan(*args, kv.k_cache) is None
