"""Fewer kernels a layer on CUDA: the model's norms and gated activation through Triton kernels
(``kernels/triton_norm.py``, ``kernels/triton_act.py``), each switched on by the model runner at
start-up only where it can run (a 16-bit model on CUDA) and agrees with PyTorch's path on a check
run then (within two units in the last place of the model's dtype). Each ``fuse_*`` returns why
not, or None once fused; a failed check logs and keeps PyTorch's path, which still serves.

- RMSNorm: one kernel for PyTorch's eight (cast, square, mean, add, rsqrt, multiply, cast,
  multiply); and where a layer adds its attention output to the residual and norms the sum for
  the MLP, the add joins the same kernel (``RMSNorm.add``).
- SwiGLU's ``silu(gate) * up``: one kernel for two.
"""

from __future__ import annotations

import logging

import torch

from .model.layers import MLP, RMSNorm

__all__ = ["fuse_activations", "fuse_norms"]

log = logging.getLogger(__name__)

_RTOL = 2**-6  # two units in the last place of bfloat16 (one of float16's four)


def _unfusable(model, device: torch.device) -> str | None:
    from radixray.kernels.backends import _triton_unavailable

    dtype = getattr(model, "dtype", None)
    if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
        return f"not a 16-bit model on CUDA ({device.type}, {dtype})"
    return _triton_unavailable(device, dtype, 64)


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if not torch.allclose(got.float(), want.float(), rtol=_RTOL, atol=1e-6):
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
