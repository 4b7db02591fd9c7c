"""RMSNorm in one Triton kernel, in the order transformers' eager LlamaRMSNorm rounds.

``weight * (x_f32 * rsqrt(mean(x_f32^2) + eps)).to(dtype)``: normalised in float32, cast to the
model's dtype, then scaled by the weight in that dtype (bf16 x bf16 rounded once, as PyTorch's
elementwise multiply does). PyTorch runs that as eight kernels (cast, square, mean, add, rsqrt,
multiply, cast, multiply); a decode step of a small model on a GPU is bound by its launches
(benchmarks/README.md, "First GPU run"), two norms a layer. One program normalises one row.

Not bit for bit PyTorch's: the sum of squares is reduced in another order and ``rsqrt`` may
differ in its last float32 bit, so a result can differ by one unit in the last place of the
model's dtype (tests/kernels/triton_cases.py bounds it). Float32 models keep
``F.rms_norm`` (already one kernel), Gemma's ``1 + w`` form keeps its own path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["MAX_HIDDEN", "rms_norm"]

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
