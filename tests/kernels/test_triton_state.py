"""The recurrent-state kernels in Triton (radixray/kernels/triton_state.py) against the plain
PyTorch reference (state_reference.py), over a step's varlen batch and its state pool.

Two kinds of test:

- the ``case_`` tests, tiny shapes: run by :func:`test_cases_in_a_subprocess`, under
  TRITON_INTERPRET=1 on a CPU (compiled with CUDA). Triton decides "compiled or interpreted"
  when a kernel module is imported, so the flag must not be set in the test process itself
  (test_triton.py runs its cases the same way); here they skip unless the subprocess's
  ``RADIXRAY_STATE_CASES=1`` is set.
- ``test_gpu_*``: Granite-4.0-H's shapes (128 heads x 64 head dim x 128 state, conv over 8448
  channels), bfloat16 and float32, compiled on CUDA; skipped without it (the GPU kit,
  benchmarks/gpu/run.sh, runs them).

Each batch mixes decode rows and prefill spans of unaligned lengths (one longer than a conv
time block, one shorter than the conv's window), some from a state, some fresh, some saving
checkpoints inside the span (against the reference cut at those points, as the engine ran it
before the saves moved into the forward). Every slot the step must not read holds NaN: fresh
sequences' slots (a slot is never cleared), the saves' slots, and slots no sequence owns,
which must come out untouched. Tolerances: float32 outputs within 1e-5 (the
same few sums in another order); conv states exactly (they are copies of inputs); bfloat16
outputs within one rounding (cases.TOLERANCE).
"""

from __future__ import annotations

import importlib.util
import os
from itertools import pairwise

import pytest
import torch

from radixray.kernels.state_reference import (
    causal_conv1d,
    causal_conv1d_update,
    ssd_scan,
    ssd_update,
)
from radixray.worker.model.state_metadata import StateMetadata
from tests.kernels.cases import TOLERANCE, run_cases_in_subprocess

ENV = "RADIXRAY_STATE_CASES"
F32, BF16 = torch.float32, torch.bfloat16
NAN = float("nan")

needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton is not installed"
)
case = pytest.mark.skipif(
    os.environ.get(ENV) != "1", reason=f"run by test_cases_in_a_subprocess ({ENV}=1)"
)
DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"


@needs_triton
@pytest.mark.integration  # a subprocess, ~5 s under the interpreter: `make test` runs it
def test_cases_in_a_subprocess():
    run_cases_in_subprocess(__file__, ENV)


# ---------------------------------------------------------------------------------------------
# the batch and the reference
# ---------------------------------------------------------------------------------------------

# (slot, cached, new[, saves]) per sequence, in batch order: decode rows (cached > 0, new == 1)
# and prefill spans, fresh (cached == 0) or from a state, some saving checkpoints inside the
# span as (tokens, slot) (state_metadata.SeqSpan.saves): one two tokens in (within K - 1 of the
# start, from a state), one two tokens into a fresh span, one in the middle; slots 3, 7 and 11
# belong to no one
SEQS = [(2, 9, 5, ((11, 8),)), (0, 12, 1), (5, 0, 37, ((2, 9), (20, 10))), (4, 3, 1)]
SEQS += [(1, 6, 2), (6, 0, 1)]


def _batch(seqs, device):
    """The step's metadata, the pool's size, the slots whose contents must never be read
    (NaN-poisoned: fresh sequences' and saves') and those no one owns (which must stay NaN)."""
    seqs = [(*s, ()) if len(s) == 3 else s for s in seqs]
    slots, cached, new, saves = zip(*seqs, strict=True)
    meta = StateMetadata.build(slots, cached, new, device, saves)
    dsts = [dst for at in saves for _, dst in at]
    num_slots = max(*slots, *dsts) + 2
    unused = sorted(set(range(num_slots)) - set(slots) - set(dsts))
    return meta, sum(new), num_slots, [s[0] for s in seqs if s[1] == 0] + dsts + unused, unused


def _pieces(span):
    """A prefill span's rows cut at its saves, each piece with the slot its state goes to (the
    engine's old plan: a step per piece, the state copied to the save's slot after it)."""
    bounds = [span.start + o for o, _ in span.saves]
    slots = [slot for _, slot in span.saves] + [span.slot]
    return zip(pairwise([span.start, *bounds, span.end]), slots, strict=True)


def _pool(shape, dtype, device, unread, gen):
    pool = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
    pool[unread] = NAN
    return pool


def _ref_conv(u, weight, bias, silu, meta, pool):
    """The reference, sequence by sequence (state_layers.conv_varlen's plan)."""
    out = torch.empty_like(u)
    for row, slot in zip(meta.decode_rows.tolist(), meta.decode_slots.tolist(), strict=True):
        state = pool[slot : slot + 1].clone()
        out[row : row + 1] = causal_conv1d_update(u[row : row + 1], weight, bias, state, silu)
        pool[slot] = state[0]
    for s in meta.prefills:
        state = pool[s.slot] if s.has_initial else None
        for (b, e), slot in _pieces(s):
            out[b:e], state = causal_conv1d(u[b:e], weight, bias, state, silu)
            pool[slot] = state
    return out


def _ref_ssd(x, dt, A, B, C, D, chunk, meta, pool):
    y = torch.empty_like(x)
    for row, slot in zip(meta.decode_rows.tolist(), meta.decode_slots.tolist(), strict=True):
        r = slice(row, row + 1)
        state = pool[slot : slot + 1].clone()
        y[r] = ssd_update(state, x[r], dt[r], A, B[r], C[r], D)
        pool[slot] = state[0]
    for s in meta.prefills:
        state = pool[s.slot] if s.has_initial else None
        for (b, e), slot in _pieces(s):
            y[b:e], state = ssd_scan(x[b:e], dt[b:e], A, B[b:e], C[b:e], D, chunk, state)
            pool[slot] = state
    return y


def check_conv(C, K, bias, silu, dtype, device, seqs=SEQS, strided=True, seed=0, layers=1):
    """``layers`` conv layers run one step's batch (the same ``meta``), each on its own pool."""
    from radixray.kernels.triton_state import conv_varlen

    gen = torch.Generator().manual_seed(seed)
    meta, T, num_slots, unread, unused = _batch(seqs, device)
    for _ in range(layers):
        wide = torch.randn(T, C + 16, generator=gen).to(device=device, dtype=dtype)
        u = wide[:, 8 : 8 + C] if strided else wide[:, :C].contiguous()  # as Mamba2's xbc split
        weight = torch.randn(C, 1, K, generator=gen).to(device=device, dtype=dtype)[:, 0]
        b = torch.randn(C, generator=gen).to(device=device, dtype=dtype) if bias else None
        pool = _pool((num_slots, C, K - 1), dtype, device, unread, gen)
        want_pool = pool.clone()
        want = _ref_conv(u, weight, b, silu, meta, want_pool)
        got = conv_varlen(u, weight, b, silu, meta, pool)
        assert not torch.isnan(got).any(), "NaN in the output: a stale slot was read"
        torch.testing.assert_close(got.float(), want.float(), **TOLERANCE[dtype])
        assert torch.isnan(pool[unused]).all(), "a slot no sequence owns was written"
        torch.testing.assert_close(pool, want_pool, rtol=0, atol=0, equal_nan=True)


def check_ssd(H, P, N, G, with_d, dtype, chunk, device, seqs=SEQS, seed=0):
    from radixray.kernels.triton_state import ssd_varlen

    gen = torch.Generator().manual_seed(seed)
    meta, T, num_slots, unread, unused = _batch(seqs, device)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)

    x = rand(T, H, P + 3)[:, :, 1 : P + 1]  # a view with padded strides, as the split's
    dt = torch.nn.functional.softplus(torch.randn(T, H, generator=gen)).to(device)
    A = -torch.rand(H, generator=gen).add(0.5).to(device)
    B, C = rand(T, G, N, scale=0.5), rand(T, G, N, scale=0.5)
    D = torch.randn(H, generator=gen).to(device) if with_d else None
    pool = _pool((num_slots, H, P, N), F32, device, unread, gen)  # float32: ssm_dtype
    want_pool = pool.clone()
    want = _ref_ssd(x, dt, A, B, C, D, chunk, meta, want_pool)
    got = ssd_varlen(x, dt, A, B, C, D, chunk, meta, pool)
    assert not torch.isnan(got).any(), "NaN in the output: a stale slot was read"
    torch.testing.assert_close(got.float(), want.float(), **TOLERANCE[dtype])
    assert torch.isnan(pool[unused]).all(), "a slot no sequence owns was written"
    used = sorted(set(range(num_slots)) - set(unused))
    torch.testing.assert_close(pool[used], want_pool[used], **TOLERANCE[F32])


# ---------------------------------------------------------------------------------------------
# tiny shapes (the interpreter)
# ---------------------------------------------------------------------------------------------


@case
@pytest.mark.parametrize(
    "C,K,bias,silu,strided",
    [
        (24, 4, True, True, True),  # Mamba2's conv: bias, SiLU, a strided view of in_proj's
        (20, 3, False, False, False),  # LFM2's: L_cache 3, no bias, no activation
        (9, 2, True, False, True),  # one tap of state
    ],
)
def test_case_conv(C, K, bias, silu, strided):
    check_conv(C, K, bias, silu, F32, DEVICE, strided=strided, seed=C)


@case
def test_case_conv_decode_only_prefill_only_and_layers_sharing_a_step():
    check_conv(16, 4, True, True, F32, DEVICE, seqs=[(3, 4, 1), (1, 2, 1)])
    check_conv(16, 4, True, True, F32, DEVICE, seqs=[(6, 0, 3), (2, 5, 33)])
    check_conv(12, 4, False, True, F32, DEVICE, layers=2)  # one prefill table for both


@case
@pytest.mark.parametrize("H,P,N,G,with_d", [(4, 8, 16, 2, True), (3, 5, 12, 1, False)])
def test_case_ssd(H, P, N, G, with_d):
    check_ssd(H, P, N, G, with_d, F32, 4, DEVICE, seed=H)


# ---------------------------------------------------------------------------------------------
# Granite-4.0-H's shapes on CUDA
# ---------------------------------------------------------------------------------------------

GRANITE_SEQS = [(7, 100, 1), (3, 0, 1000, ((256, 60), (512, 61), (768, 62))), (12, 40, 1)]
GRANITE_SEQS += [(0, 511, 37, ((512, 63),)), (9, 0, 2), (30, 8, 1)]
GRANITE_SEQS += [(40 + i, 300 + i, 1) for i in range(20)]  # a decode batch of 23


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [BF16, F32])
def test_gpu_conv_granite(dtype, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # the reference's conv1d
    check_conv(128 * 64 + 2 * 128, 4, True, True, dtype, "cuda", seqs=GRANITE_SEQS)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [BF16, F32])
def test_gpu_ssd_granite(dtype, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # the reference's conv1d
    check_ssd(128, 64, 128, 1, True, dtype, 256, "cuda", seqs=GRANITE_SEQS)


@pytest.mark.gpu
def test_gpu_state_layers_dispatch_to_triton_and_equal_the_cpu_path(monkeypatch):
    """state_layers' own entry points on CUDA tensors run triton_state's (counted), and give
    the CPU path's outputs and pools (LFM2's conv, then Mamba2's conv and scan)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from radixray.kernels import triton_state
    from radixray.worker.model import state_layers

    calls = []
    for name in ("conv_varlen", "ssd_varlen"):
        fn = getattr(triton_state, name)
        spy = lambda *a, _fn=fn, _name=name: calls.append(_name) or _fn(*a)  # noqa: E731
        monkeypatch.setattr(triton_state, name, spy)
    gen = torch.Generator().manual_seed(3)
    H, P, N, G, K = 4, 16, 8, 2, 4
    Cc = H * P + 2 * G * N
    meta_cpu, T, num_slots, unread, _ = _batch(SEQS, "cpu")
    meta_gpu = _batch(SEQS, "cuda")[0]
    cpu = {
        "u": torch.randn(T, Cc, generator=gen),
        "w": torch.randn(Cc, K, generator=gen),
        "b": torch.randn(Cc, generator=gen),
        "conv": _pool((num_slots, Cc, K - 1), F32, "cpu", unread, gen),
        "dt": torch.rand(T, H, generator=gen),
        "A": -torch.rand(H, generator=gen).add(0.5),
        "D": torch.randn(H, generator=gen),
        "ssm": _pool((num_slots, H, P, N), F32, "cpu", unread, gen),
    }
    gpu = {k: v.cuda() for k, v in cpu.items()}
    outs = []
    for t, meta in ((cpu, meta_cpu), (gpu, meta_gpu)):
        xbc = state_layers.conv_varlen(t["u"], t["w"], t["b"], True, meta, t["conv"])
        x, B, C = xbc.split([H * P, G * N, G * N], dim=-1)
        x, B, C = x.reshape(T, H, P), B.reshape(T, G, N), C.reshape(T, G, N)
        y = state_layers.ssd_varlen(x, t["dt"], t["A"], B, C, t["D"], 4, meta, t["ssm"])
        outs.append((xbc, y, t["conv"], t["ssm"]))
    assert calls == ["conv_varlen", "ssd_varlen"]
    for want, got in zip(*outs, strict=True):
        torch.testing.assert_close(got.cpu(), want, equal_nan=True, **TOLERANCE[F32])
