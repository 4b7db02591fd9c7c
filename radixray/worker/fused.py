"""Fewer kernels a layer on CUDA: the model's norms and gated activation through Triton kernels
(``kernels/triton_norm.py``, ``kernels/triton_act.py``), each switched on by the model runner at
start-up only where it can run (a 16-bit model on CUDA) and agrees with PyTorch's path on a check
run then (within two units in the last place of the model's dtype). Each ``fuse_*`` returns why
not, or None once fused; a failed check logs and keeps PyTorch's path, which still serves.

- RMSNorm: one kernel for PyTorch's eight (cast, square, mean, add, rsqrt, multiply, cast,
  multiply); and where a layer adds its attention output to the residual and norms the sum for
  the MLP, the add joins the same kernel (``RMSNorm.add``).
- SwiGLU's ``silu(gate) * up``: one kernel for two.
- RoPE with the KV store (``kernels/triton_rope_store.py``, :func:`fuse_rope`): q and k read from
  the qkv projection's output, Qwen3's per-head q/k norms, the rotation from the full float32
  tables at each row's position, q out and k, v into the Triton backend's pool: one kernel for
  ~8-10 (the per-step gather and cats of the tables, a cast, the rotation, a cast back, the
  norms, the store). Rows and pool come from the step's static buffers (positions, slots), and
  nothing reads the device: it runs inside the decode CUDA graphs as eagerly.

With all three on, a bf16 decode layer on CUDA (the Triton backend) runs ten kernels and casts
nothing (a cast inside a kernel is a register op): add_rms_norm (the previous layer's MLP output
joins the residual there; the first layer's is rms_norm), qkv GEMM, rope_store, decode split,
decode merge, o_proj GEMM, add_rms_norm, gate_up GEMM, silu_and_mul, down GEMM. What still
converts a dtype, and why:

- the logits (``LlamaModel._logits``): float32 for the sampler, once a step, after the layers;
- Gemma's ``1 + w`` norms (and their q/k norms) normalise and scale in float32 as transformers
  does, and keep PyTorch's path with its casts (no fused kernel for the offset form);
- soft-capped attention (Gemma 2, ``window.py``) computes its scores in float32, per sequence;
- the attention kernels' float32 accumulators and split-KV partials live inside the kernels;
- ``store_kv``'s ``.to(cache dtype)`` (the unfused path and the flash_attn backend's store) is
  a no-op returning the same tensor when k and the pool share the model's dtype, as here.
"""

from __future__ import annotations

import logging

import torch

from .model.layers import MLP, RMSNorm
from .model.llama import Attention, Step

__all__ = ["RopeStore", "fuse_activations", "fuse_norms", "fuse_rope"]

log = logging.getLogger(__name__)

_RTOL = 2**-6  # two units in the last place of bfloat16 (one of float16's four)


def _unfusable(model, device: torch.device) -> str | None:
    from radixray.kernels.backends import _triton_unavailable

    dtype = getattr(model, "dtype", None)
    if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
        return f"not a 16-bit model on CUDA ({device.type}, {dtype})"
    return _triton_unavailable(device, dtype, 64)


def _close(got: torch.Tensor, want: torch.Tensor, what: str, atol: float = 1e-6) -> None:
    if not torch.allclose(got.float(), want.float(), rtol=_RTOL, atol=atol):
        err = (got.float() - want.float()).abs().max().item()
        raise AssertionError(f"{what}: max difference {err:.3g} from PyTorch's")


def _inputs(device: torch.device, dtype, *shape: int) -> torch.Tensor:
    gen = torch.Generator(device=device).manual_seed(0)  # the global RNG left alone
    return torch.randn(*shape, device=device, generator=gen).mul_(4).to(dtype)


def fuse_norms(model, device: torch.device) -> str | None:
    """Route ``model``'s RMSNorms (and their residual adds) through the Triton kernels."""
    norms = [m for m in model.modules() if isinstance(m, RMSNorm)]
    if (why := _unfusable(model, device)) is not None:
        return why
    if not norms or any(m.offset for m in norms):
        return "the model's norms scale by 1 + w (their own path)"
    from radixray.kernels.triton_norm import MAX_HIDDEN, add_rms_norm, rms_norm

    try:
        norm = max(norms, key=lambda m: m.weight.numel())
        H = norm.weight.numel()
        if H > MAX_HIDDEN:
            return f"hidden size {H} > {MAX_HIDDEN}"
        x, r = _inputs(device, model.dtype, 2, 33, H)
        _close(rms_norm(x, norm.weight, norm.eps), norm(x), "rms_norm")
        total, normed = add_rms_norm(x, r, norm.weight, norm.eps)
        _close(total, x + r, "add_rms_norm's sum")
        _close(normed, norm(total), "add_rms_norm")
    except Exception as e:
        log.warning("fused RMSNorm off: %s: %s", type(e).__name__, e)
        return f"check failed: {type(e).__name__}: {e}"
    for m in norms:
        m.fused, m.fused_add = rms_norm, add_rms_norm
    return None


def fuse_activations(model, device: torch.device) -> str | None:
    """Route ``model``'s SwiGLU activations through the Triton kernel."""
    mlps = [m for m in model.modules() if isinstance(m, MLP)]
    if (why := _unfusable(model, device)) is not None:
        return why
    if not mlps or any(m.gelu for m in mlps):
        return "no SwiGLU MLP (GeGLU keeps its own path)"
    from radixray.kernels.triton_act import silu_and_mul

    try:
        inter = max(m.intermediate_size for m in mlps)
        gate_up = _inputs(device, model.dtype, 33, 2 * inter)
        gate, up = gate_up.split(inter, dim=-1)
        _close(silu_and_mul(gate_up), torch.nn.functional.silu(gate) * up, "silu_and_mul")
    except Exception as e:
        log.warning("fused SwiGLU off: %s: %s", type(e).__name__, e)
        return f"check failed: {type(e).__name__}: {e}"
    for m in mlps:
        m.fused_act = silu_and_mul
    return None


class RopeStore:
    """``Attention.fused_rope``: one layer's q/k norms (if any), RoPE and K/V store as one
    kernel at the step's positions and slots; returns q ``[T, Hq, D]``. The norms' weights are
    read at each call (a later weight load is seen)."""

    def __init__(self, attn: Attention, table, kernel) -> None:
        self.num_heads, self.q_norm, self.k_norm = attn.num_heads, attn.q_norm, attn.k_norm
        self.table, self.kernel = table, kernel

    def __call__(self, qkv, step: Step, k_cache, v_cache) -> torch.Tensor:
        qn, kn, eps = None, None, 0.0
        if self.q_norm is not None:
            qn, kn, eps = self.q_norm.weight, self.k_norm.weight, self.q_norm.eps
        cos, sin = self.table.cos, self.table.sin
        slots = step.plan.slot_mapping
        heads = self.num_heads
        return self.kernel(
            qkv, step.positions, slots, cos, sin, k_cache, v_cache, heads, qn, kn, eps
        )


def _check_rope_store(model, attn: Attention, fused: RopeStore, device) -> None:
    """The kernel against the layer's own PyTorch path (``Attention._rope_store``) on one
    step of 9 rows at random positions, one row unstored, in a pool of the backend's pages."""
    backend, table = model.attention, fused.table
    T, Hkv, D, P = 9, attn.num_kv_heads, attn.head_dim, backend.page_size
    qkv = _inputs(device, model.dtype, T, attn.q_size + 2 * attn.kv_size)
    gen = torch.Generator(device=device).manual_seed(1)
    positions = torch.randint(0, table.cos.shape[0], (T,), device=device, generator=gen)
    slots = torch.randperm(T + P, device=device, generator=gen)[:T]
    slots[T // 2] = -1
    pools = [torch.zeros(-(-(T + P) // P), P, Hkv, D, dtype=model.dtype, device=device)]
    pools += [p.clone() for p in pools * 3]
    one = torch.tensor([T], dtype=torch.int32, device=device)
    block_table = torch.arange(pools[0].shape[0], dtype=torch.int32, device=device)[None]
    cu = torch.tensor([0, T], dtype=torch.int32, device=device)
    plan = backend.prepare(slots, block_table, cu, one, T)
    step = Step(backend, plan, None, positions, {attn.rope: table})
    want = attn._rope_store(qkv, step, pools[0], pools[1])
    got = fused(qkv, step, pools[2], pools[3])
    atol = 2**-6 * want.abs().max().item()  # two units of the largest value (qk-norm's bound)
    _close(got, want, "rope_store's q", atol)
    _close(pools[2], pools[0], "rope_store's k", atol)
    if not torch.equal(pools[3], pools[1]):
        raise AssertionError("rope_store's v: not PyTorch's store bit for bit")


def fuse_rope(model, device: torch.device) -> str | None:
    """Route ``model``'s attention layers' q/k norms, RoPE and K/V store through one Triton
    kernel: the layers with RoPE over the whole head and, if any, offset-0 q/k norms, on the
    Triton backend's pool. Others (NoPE, Gemma's ``1 + w`` q/k norms) keep PyTorch's path."""
    if (why := _unfusable(model, device)) is not None:
        return why
    backend = getattr(model, "attention", None)
    if backend is None or backend.name != "triton":
        name = getattr(backend, "name", None)
        return f"the {name} attention backend's store (the kernel writes the Triton one's pool)"
    attns = [m for m in model.modules() if isinstance(m, Attention) and m.rope is not None]
    attns = [m for m in attns if m.q_norm is None or not m.q_norm.offset]
    if not attns:
        return "no attention layer with RoPE and offset-0 (or no) q/k norms"
    from radixray.kernels.triton_rope_store import rope_store

    tables = dict(zip(model._rope_keys, model.ropes, strict=True))
    fused = {m: RopeStore(m, tables[m.rope], rope_store) for m in attns}
    try:
        _check_rope_store(model, attns[0], fused[attns[0]], device)
    except Exception as e:
        log.warning("fused RoPE + KV store off: %s: %s", type(e).__name__, e)
        return f"check failed: {type(e).__name__}: {e}"
    for m, f in fused.items():
        m.fused_rope = f
    return None
