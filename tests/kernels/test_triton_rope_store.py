"""RoPE fused with the KV store (radixray/kernels/triton_rope_store.py) against the unfused path
the model runs without it: ``layers.RMSNorm`` per head (qk_norm), ``layers.apply_rope`` with
``RotaryEmbedding``'s per-step tables, ``reference.store_kv``.

The ``case_`` tests use tiny shapes and run in one subprocess (:func:`test_cases_in_a_subprocess`)
under TRITON_INTERPRET=1 on a CPU, compiled on CUDA (where the GPU kit runs them, through
:func:`test_cases_compiled_on_cuda`): Triton decides "compiled or interpreted" when a kernel
module is imported, so the flag must not be set in the test process (as test_triton.py and
test_triton_state.py do). The argument checks run here, without Triton.

Tolerances, stated:

- float32 without a qk-norm: exact (the same IEEE products and sums, no FMA);
- float32 with one: within 1e-6 relative (the norm's sum of squares in another order, and
  PyTorch's ``F.rms_norm`` against our ``1 / sqrt``);
- bfloat16 without a qk-norm: within one unit in the last place of bfloat16 (bit for bit on a
  GPU, where the cast rounds; the interpreter's cast truncates, one unit at most);
- bfloat16 with one: within two units of the head's largest value on a GPU, three under the
  interpreter. The norm rounds twice before the rotation rounds: its sum in another order may
  move the first rounding by a unit, which the weight's product can carry into the second, and
  a unit of the rotation's input is a unit of the head's scale, not of a small result; the
  interpreter truncates all three casts (each up to a unit, all toward zero).

Every pool slot not in ``slot_mapping`` holds NaN and must come out untouched; rows with slot -1
store nothing but still produce their q.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from radixray.kernels import reference
from radixray.kernels._validate import check_rope_store
from radixray.worker.model.layers import RMSNorm, RotaryEmbedding, apply_rope
from tests.kernels.cases import run_cases_in_subprocess

ENV = "RADIXRAY_ROPE_STORE_CASES"
F32, BF16 = torch.float32, torch.bfloat16
MAX_POS = 4096

case = pytest.mark.skipif(
    os.environ.get(ENV) != "1", reason=f"run by test_cases_in_a_subprocess ({ENV}=1)"
)
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRET else "cuda"


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
@pytest.mark.integration  # a subprocess, ~4 s under the interpreter: `make test` runs it
@pytest.mark.parallel_safe  # CPU work only
def test_cases_in_a_subprocess():
    run_cases_in_subprocess(__file__, ENV)


@pytest.mark.gpu  # the GPU kit runs the marked tests: the same cases, compiled on CUDA
def test_cases_compiled_on_cuda():
    test_cases_in_a_subprocess()


def _inputs(dtype, T, Hq, Hkv, D, P, qk_norm, seed, pad=0):
    """A projection's output (a column slice of a wider tensor when ``pad``: rows at a stride
    of their own), positions far apart (the table's first and last among them), slots in a
    shuffled pool with every other row's slot -1, norm weights, a NaN-poisoned pool."""
    gen = torch.Generator().manual_seed(seed)
    width = (Hq + 2 * Hkv) * D
    qkv = (torch.randn(T, width + pad, generator=gen) * 3).to(DEVICE, dtype)[:, :width]
    positions = torch.randint(0, MAX_POS, (T,), generator=gen)
    positions[0], positions[-1] = 0, MAX_POS - 1
    pages = T // P + 3
    slots = torch.randperm(pages * P, generator=gen)[:T]
    slots[1::2] = -1
    w = [(1 + torch.randn(D, generator=gen) / 4).to(DEVICE, dtype) for _ in range(2)]
    pool = torch.full((pages, P, Hkv, D), float("nan"), dtype=dtype, device=DEVICE)
    return qkv, positions.to(DEVICE), slots.to(DEVICE), (w if qk_norm else [None, None]), pool


def _unfused(qkv, positions, slots, rope, weights, k_cache, v_cache, Hq, eps):
    """The model's path without the kernel (llama.Attention with fused_rope None)."""
    T, (Hkv, D) = qkv.shape[0], k_cache.shape[2:]
    q = qkv[:, : Hq * D].view(T, Hq, D)
    k = qkv[:, Hq * D : (Hq + Hkv) * D].view(T, Hkv, D)
    v = qkv[:, (Hq + Hkv) * D :].view(T, Hkv, D)
    if weights[0] is not None:
        norms = [RMSNorm(D, eps, DEVICE) for _ in range(2)]
        for norm, w in zip(norms, weights, strict=True):
            norm.weight.data = w
        q, k = norms[0](q), norms[1](k)
    cos, sin = rope(positions)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    reference.store_kv(k, v, k_cache, v_cache, slots)
    return q


def _ulps(got: torch.Tensor, want: torch.Tensor, scale: torch.Tensor) -> float:
    """The largest |got - want| in units of bfloat16's last place at ``scale``."""
    unit = torch.exp2(torch.floor(torch.log2(scale.float().abs().clamp_min(1e-30))) - 7)
    return ((got.float() - want.float()).abs() / unit).max().item()


# (dtype, T, Hq, Hkv, D, page size, qk_norm): GQA and MHA, a head dim not a power of two (48:
# halves of 24 in blocks of 32), more query heads than a block (20 > 16: two inner steps)
CASES = [
    (F32, 6, 4, 2, 16, 4, False),
    (F32, 5, 4, 2, 16, 4, True),
    (BF16, 6, 4, 2, 16, 4, False),
    (BF16, 7, 6, 2, 48, 2, True),
    (BF16, 4, 20, 20, 8, 1, False),
]


@case
@pytest.mark.parametrize("dtype,T,Hq,Hkv,D,P,qk_norm", CASES)
def test_case_against_the_unfused_path(dtype, T, Hq, Hkv, D, P, qk_norm):
    from radixray.kernels.triton_rope_store import rope_store

    qkv, positions, slots, w, pool = _inputs(dtype, T, Hq, Hkv, D, P, qk_norm, T + Hq + D, pad=D)
    rope = RotaryEmbedding(D, 10000.0, MAX_POS, DEVICE)
    k_got, v_got, k_want, v_want = (pool.clone() for _ in range(4))
    eps = 1e-6
    want = _unfused(qkv, positions, slots, rope, w, k_want, v_want, Hq, eps)
    got = rope_store(qkv, positions, slots, rope.cos, rope.sin, k_got, v_got, Hq, *w, eps)
    assert got.shape == (T, Hq, D) and got.dtype == dtype and got.is_contiguous()
    # the same slots written (NaN elsewhere: untouched), v copied bit for bit
    assert torch.equal(k_got.isnan(), k_want.isnan()) and torch.equal(v_got.isnan(), v_want.isnan())
    assert k_got.isnan().sum() == k_got.numel() - (T + 1) // 2 * Hkv * D
    assert torch.equal(v_got.nan_to_num(), v_want.nan_to_num())
    written = ~k_want.isnan()
    pairs = [(got, want), (k_got[written], k_want[written])]
    if dtype == F32 and not qk_norm:
        assert all(torch.equal(a, b) for a, b in pairs)
    elif dtype == F32:
        for a, b in pairs:
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    elif not qk_norm:  # bit for bit where the cast rounds (CUDA), a unit where it truncates
        assert max(_ulps(a, b, b) for a, b in pairs) <= (1 if INTERPRET else 0)
    else:  # units of each head's largest value
        units = 3 if INTERPRET else 2
        q_max = want.float().abs().amax(-1, keepdim=True).expand_as(want)
        assert _ulps(got, want, q_max) <= units
        k_max = k_want.float().nan_to_num().abs().amax(-1, keepdim=True).expand_as(k_want)
        assert _ulps(k_got[written], k_want[written], k_max[written]) <= units


@case
def test_case_no_rows_and_a_layer_of_a_bigger_pool():
    """T = 0 launches nothing; the pool one layer of ``[layers, pages, P, Hkv, D]`` (strided
    between layers, as the model passes it) is written at that layer only."""
    from radixray.kernels.triton_rope_store import rope_store

    qkv, positions, slots, w, pool = _inputs(F32, 3, 2, 1, 8, 4, False, 1)
    rope = RotaryEmbedding(8, 10000.0, MAX_POS, DEVICE)
    big = torch.full((2, *pool.shape), float("nan"), device=DEVICE)
    q = rope_store(qkv[:0], positions[:0], slots[:0], rope.cos, rope.sin, big[1], big[0], 2)
    assert q.shape == (0, 2, 8) and big.isnan().all()
    k_want, v_want = pool.clone(), pool.clone()
    _unfused(qkv, positions, slots, rope, w, k_want, v_want, 2, 1e-6)
    rope_store(qkv, positions, slots, rope.cos, rope.sin, big[1], big[0], 2)
    assert torch.equal(big[1].nan_to_num(), k_want.nan_to_num())
    assert torch.equal(big[0].nan_to_num(), v_want.nan_to_num())


# --- argument checks (no Triton: the wrapper's checks are _validate.check_rope_store) ----------


def _args(**change):
    T, Hq, Hkv, D = 3, 4, 2, 8
    args = {
        "qkv": torch.zeros(T, (Hq + 2 * Hkv) * D),
        "positions": torch.zeros(T, dtype=torch.int64),
        "slot_mapping": torch.zeros(T, dtype=torch.int64),
        "cos": torch.zeros(16, D // 2),
        "sin": torch.zeros(16, D // 2),
        "k_cache": torch.zeros(2, 4, Hkv, D),
        "v_cache": torch.zeros(2, 4, Hkv, D),
        "num_heads": Hq,
        "q_norm": None,
        "k_norm": None,
    }
    return args | change


@pytest.mark.parametrize(
    "change,match",
    [
        ({"qkv": torch.zeros(3, 60)}, r"qkv must be \[T, \(num_heads=4 \+ 2 \* Hkv=2\) \* D=8\]"),
        ({"qkv": torch.zeros(3, 64, dtype=torch.bfloat16)}, "qkv must be torch.float32"),
        ({"qkv": torch.zeros(64, 3).t()}, "qkv must have a contiguous last axis"),
        ({"num_heads": 3}, "num_heads must be a positive multiple of the cache's Hkv=2, got 3"),
        ({"positions": torch.zeros(2, dtype=torch.int64)}, r"positions must have shape \[3\]"),
        ({"slot_mapping": torch.zeros(3)}, "slot_mapping must be int32 or int64"),
        ({"cos": torch.zeros(16, 8)}, r"cos must be float32 \[max_positions, D/2=4\]"),
        ({"sin": torch.zeros(16, 4, dtype=torch.float64)}, "sin must be float32"),
        ({"sin": torch.zeros(8, 4)}, "sin .* must be laid out as cos"),
        ({"q_norm": torch.ones(8)}, "q_norm and k_norm must both be given"),
        ({"q_norm": torch.ones(4), "k_norm": torch.ones(8)}, r"q_norm must be \[8\]"),
        ({"v_cache": torch.zeros(2, 4, 2, 4)}, "v_cache shape"),
    ],
)
def test_bad_arguments_name_the_argument(change, match):
    with pytest.raises(ValueError, match=match):
        check_rope_store(**_args(**change))
    assert check_rope_store(**_args()) == (2, 8)


@case
def test_case_a_fused_engine_keeps_pytorchs_logits(monkeypatch):
    """worker/fused.fuse_rope on a tiny bf16 Qwen3-like model (qk-norm; layer 0 a sliding
    window, with its own pool and slots, and its own RoPE table) on the Triton backend (the
    interpreter here; the device check waived): its start-up check passes, every attention layer
    takes the kernel, and a prompt's and two decode steps' logits are within bf16's rounding of
    the same engine with the PyTorch path."""
    import dataclasses

    from radixray.model_meta import tiny_config
    from radixray.worker import Engine, EngineConfig, SamplingParams, fused
    from radixray.worker.model.llama import Attention, LlamaModel
    from radixray.worker.model.loader import random_hf_state_dict

    cfg = dataclasses.replace(
        tiny_config(), qk_norm=True, layer_windows=(8, None), layer_rope=((1e4, 1.0), (1e6, 1.0))
    )
    logits = []
    for on in (True, False):
        model = LlamaModel(cfg, DEVICE, F32)
        model.load_hf_state_dict(random_hf_state_dict(cfg, 0))
        ecfg = EngineConfig(
            model="tiny", device=DEVICE, dtype="float32", attention_backend="triton",
            page_size=4, num_pages=64, seed=0, cuda_graph_max_batch=0, host_pages=0,
        )  # fmt: skip
        e = Engine(ecfg, loaded=(model, cfg, None))
        assert e.runner.fused_rope == f"not a 16-bit model on CUDA ({DEVICE}, torch.float32)"
        if on:  # the norms and SwiGLU keep PyTorch's path: the interpreter is slow
            monkeypatch.setattr(fused, "_unfusable", lambda model, device: None)
            assert fused.fuse_rope(model, torch.device(DEVICE)) is None
            monkeypatch.undo()
        attns = [m for m in model.modules() if isinstance(m, Attention)]
        assert all((m.fused_rope is not None) == on for m in attns)
        run = e.runner.run
        e.runner.run = lambda b, run=run: logits.append(run(b).clone()) or logits[-1]
        e.generate_batch([list(range(3, 15))], SamplingParams(max_tokens=2, temperature=0.0))
    half = len(logits) // 2
    for got, want in zip(logits[:half], logits[half:], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
