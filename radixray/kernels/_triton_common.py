"""Small pieces shared by the Triton kernels."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["dot", "interpreting", "upcast_dot"]


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return bool(triton.knobs.runtime.interpret)


def upcast_dot(dtype: torch.dtype) -> bool:
    """The interpreter's tl.dot gives garbage for bfloat16 operands (Triton 3.9: it multiplies
    the raw 16-bit patterns), so under the interpreter bf16 operands are widened to float32 first.
    Compiled kernels keep bf16 tensor-core dots."""
    return dtype == torch.bfloat16 and interpreting()


@triton.jit
def dot(a, b, UPCAST: tl.constexpr):
    """a @ b with float32 accumulation; float32 operands in full precision (no TF32)."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision="ieee")
