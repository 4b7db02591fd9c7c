"""RMSNorm in one Triton kernel, in the order transformers' eager LlamaRMSNorm rounds.

``weight * (x_f32 * rsqrt(mean(x_f32^2) + eps)).to(dtype)``: normalised in float32, cast to the
model's dtype, then scaled by the weight in that dtype (bf16 x bf16 rounded once, as PyTorch's
elementwise multiply does). PyTorch runs that as eight kernels (cast, square, mean, add, rsqrt,
multiply, cast, multiply); a decode step of a small model on a GPU is bound by its launches
(benchmarks/README.md, "First GPU run"), two norms a layer. One program normalises one row.

``add_rms_norm`` also adds the residual first, in the same kernel: ``s = x + residual`` rounded
to the model's dtype (PyTorch's add), written out for the next residual, then normed. A layer's
attention output joins the residual and is normed for the MLP in one kernel where PyTorch takes
an add and the norm's eight.

Not bit for bit PyTorch's: the sum of squares is reduced in another order and ``rsqrt`` may
differ in its last float32 bit, so a result can differ by one unit in the last place of the
model's dtype (tests/kernels/triton_cases.py bounds it). Float32 models keep
``F.rms_norm`` (already one kernel), Gemma's ``1 + w`` form keeps its own path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["MAX_HIDDEN", "add_rms_norm", "rms_norm"]

MAX_HIDDEN = 16384  # one row in one program's registers; wider rows keep the PyTorch path


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    stride_x,
    stride_out,
    hidden,
    eps,
    BLOCK: tl.constexpr,  # hidden padded to a power of two
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / hidden + eps)
    y = (x * inv).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + offs, (w * y).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _add_rms_norm_kernel(
    x_ptr,
    r_ptr,
    w_ptr,
    sum_ptr,
    out_ptr,
    hidden,
    eps,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    at = row * hidden + offs
    x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + at, mask=mask, other=0.0).to(tl.float32)
    s = (x + r).to(sum_ptr.dtype.element_ty)
    tl.store(sum_ptr + at, s, mask=mask)
    s = s.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(s * s, axis=0) / hidden + eps)
    y = (s * inv).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + at, (w * y).to(out_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``s = x + residual`` and RMSNorm(s) in one kernel, both ``[T, H]`` in ``x``'s dtype
    (``x`` and ``residual`` contiguous ``[T, H]``, ``weight [H]``); returns ``(s, norm)``."""
    T, H = x.shape
    if residual.shape != x.shape or residual.dtype != x.dtype or weight.shape != (H,):
        raise ValueError(
            f"residual must be {tuple(x.shape)} {x.dtype} and weight [{H}], got "
            f"{tuple(residual.shape)} {residual.dtype} and {tuple(weight.shape)}"
        )
    if H > MAX_HIDDEN:
        raise ValueError(f"hidden size must be at most {MAX_HIDDEN}, got {H}")
    x, residual = x.contiguous(), residual.contiguous()
    total, out = torch.empty_like(x), torch.empty_like(x)
    if T:
        block = triton.next_power_of_2(H)
        _add_rms_norm_kernel[(T,)](
            x,
            residual,
            weight,
            total,
            out,
            H,
            eps,
            BLOCK=block,
            num_warps=max(1, min(16, block // 256)),
        )
    return total, out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last axis of ``x [..., H]`` (rows with a contiguous last axis and one
    stride between them), ``weight [H]`` in ``x``'s dtype; returns a new ``x``-shaped tensor."""
    H = x.shape[-1]
    if weight.shape != (H,) or weight.dtype != x.dtype or weight.device != x.device:
        raise ValueError(
            f"weight must be [{H}] {x.dtype} on {x.device}, got {tuple(weight.shape)} "
            f"{weight.dtype} on {weight.device}"
        )
    if H > MAX_HIDDEN:
        raise ValueError(f"hidden size must be at most {MAX_HIDDEN}, got {H}")
    rows = x.reshape(-1, H)  # a view when the rows share one stride (else a copy)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0]:
        block = triton.next_power_of_2(H)
        _rms_norm_kernel[(rows.shape[0],)](
            rows,
            weight,
            out,
            rows.stride(0),
            out.stride(0),
            H,
            eps,
            BLOCK=block,
            num_warps=max(1, min(16, block // 256)),
        )
    return out.view(x.shape)
