"""The "cpu" backend (kernels/cpu.py) against the "torch" reference, both as backend objects: mixed
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
    for name in ("torch", "cpu"):
        backend = K.make_backend(name, "cpu", torch.float32, P, D)
        kc, vc = kv.k_cache.clone(), kv.v_cache.clone()
        plan = backend.prepare(slot_mapping, kv.block_table, cu, kv.seq_lens, max(q_lens))
        backend.store(plan, k_new, v_new, kc, vc)
        out = backend.attend(plan, q, kc, vc, D**-0.5)
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


def test_cpu_backend_is_the_automatic_choice_for_float32_on_cpu(monkeypatch):
    monkeypatch.delenv(K.ENV_VAR, raising=False)
    assert K.make_backend(None, "cpu", torch.float32, 4, 8).name == "cpu"
    assert K.make_backend("auto", "cpu", torch.float32, 4, 8).name == "cpu"
    assert K.make_backend(None, "cpu", torch.float64, 4, 8).name == "torch"
    assert K.make_backend("torch", "cpu", torch.float32, 4, 8).name == "torch"  # named: the spec
    with pytest.raises(K.BackendUnavailableError, match="needs float32, got torch.bfloat16"):
        K.make_backend("cpu", "cpu", torch.bfloat16, 4, 8)
    monkeypatch.setenv(K.ENV_VAR, "torch")
    assert K.make_backend(None, "cpu", torch.float32, 4, 8).name == "torch"
    assert K.make_backend("cpu", "cpu", torch.float32, 4, 8).name == "cpu"  # argument wins


def test_functional_api_on_cpu_runs_the_cpu_backend_and_matches(monkeypatch):
    monkeypatch.delenv(K.ENV_VAR, raising=False)
    (ref, kr, vr), _ = run_both([3, 1], [7, 12], 4, 4, 2, seed=3)
    gen = torch.Generator().manual_seed(3)
    kv = make_paged_kv([7, 12], 4, 2, 32, torch.float32, "cpu", gen)
    q = make_query(4, 4, 32, torch.float32, "cpu", gen)
    k_new, v_new = torch.randn(4, 2, 32, generator=gen), torch.randn(4, 2, 32, generator=gen)
    cu = make_cu_seqlens([3, 1], "cpu")
    slots = [int(kv.block_table[0, p // 4]) * 4 + p % 4 for p in (4, 5, 6)]
    slots.append(int(kv.block_table[1, 11 // 4]) * 4 + 11 % 4)
    assert K.resolve_backend(None, q, kv.k_cache) == "cpu"
    K.store_kv(k_new, v_new, kv.k_cache, kv.v_cache, torch.tensor(slots))
    assert torch.equal(kv.k_cache, kr) and torch.equal(kv.v_cache, vr)
    out = K.extend_attention(q, kv.k_cache, kv.v_cache, kv.block_table, cu, kv.seq_lens, 32**-0.5)
    torch.testing.assert_close(out, ref, **TOLERANCE[torch.float32])
