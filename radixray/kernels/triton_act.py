"""The gated MLP's activation in one Triton kernel: ``silu(gate) * up``.

The MLP's fused projection gives ``[T, 2I]`` (gate, then up); PyTorch runs the activation as two
kernels (SiLU, then the product), each rounding to the model's dtype. This does both in one
pass, rounding where PyTorch does: ``silu`` computed in float32 and rounded to the dtype, then
the product computed in float32 and rounded again. ``exp`` may differ from PyTorch's in its
last float32 bit, so a result can differ by one unit in the last place of the dtype
(tests/kernels/triton_cases.py bounds it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["silu_and_mul"]

BLOCK = 1024  # columns a program takes


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, inter, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(x_ptr + row * 2 * inter + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * inter + inter + cols, mask=mask, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * inter + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate_up[:, :I]) * gate_up[:, I:]`` for ``gate_up [T, 2I]``; returns ``[T, I]``."""
    T, two_i = gate_up.shape
    if two_i % 2:
        raise ValueError(f"gate_up must be [T, 2 * intermediate], got {tuple(gate_up.shape)}")
    inter = two_i // 2
    gate_up = gate_up.contiguous()
    out = torch.empty(T, inter, dtype=gate_up.dtype, device=gate_up.device)
    if T:
        _silu_and_mul_kernel[(T, triton.cdiv(inter, BLOCK))](gate_up, out, inter, BLOCK=BLOCK)
    return out
