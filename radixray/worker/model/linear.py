"""A linear layer (bias optional: Qwen2's q/k/v) whose weight can be pre-packed for oneDNN on CPU.

Why: for the small row counts of CPU decoding (a few to a few dozen tokens per step) MKL's sgemm
behind ``F.linear`` re-packs the whole weight matrix on every call, so a decode step at batch 8
reads each weight about three times; measured on SmolLM2-135M (30 layers + LM head, 1 thread) the
linears of one step took ~2.5x as long at 8 rows as at 1. Reordering each weight once into
oneDNN's blocked layout (``torch.ops.mkldnn._reorder_linear_weight``, what torch's own
``torch.utils.mkldnn`` and inductor use) removes that per-call copy.

A side effect we rely on: oneDNN's result for a row does not depend on how many other rows are in
the batch (checked in tests/worker/model/test_linear.py), whereas MKL picks different kernels by
row count. So a token's logits are bitwise the same whether it is decoded alone, in a batch, or
recomputed in a prefill chunk, which keeps greedy outputs equal with the prefix cache on and off.

Packing is float32 on CPU only; elsewhere the layer stays a plain ``F.linear``. A packed weight is
an opaque mkldnn tensor (same shape and dtype); ``dense_weight()`` gives the values back exactly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Linear", "can_pack", "pack_linears"]

# Row-count hint for the blocked layout: any count works with any packing, this is the one it is
# tuned for (decode batches on a CPU worker are single digits to a few dozen rows).
_PACK_ROWS_HINT = 8


def can_pack(weight: torch.Tensor) -> bool:
    """True where oneDNN packing applies: a float32 CPU weight and a torch built with oneDNN."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


class Linear(nn.Module):
    """``y = x @ weight.T (+ bias)``; ``weight`` is ``[out_features, in_features]`` (plain or
    packed), ``bias`` ``[out_features]`` or None."""

    def __init__(self, in_features: int, out_features: int, device=None, bias: bool = False):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(
            torch.empty(out_features, in_features, device=device), requires_grad=False
        )
        self.bias = (
            nn.Parameter(torch.empty(out_features, device=device), requires_grad=False)
            if bias
            else None
        )

    @property
    def packed(self) -> bool:
        return self.weight.is_mkldnn

    def pack(self) -> bool:
        """Replace the weight by its oneDNN-packed copy (no-op where :func:`can_pack` is False).
        Returns whether the layer is packed. The plain weight is released, so a weight tied to
        another module (an LM head tied to the embedding) is copied, not shared, once packed."""
        if not self.packed and can_pack(self.weight):
            packed = torch.ops.mkldnn._reorder_linear_weight(
                self.weight.detach().contiguous(), _PACK_ROWS_HINT
            )
            self.weight = nn.Parameter(packed, requires_grad=False)
        return self.packed

    def dense_weight(self) -> torch.Tensor:
        """The weight as a plain strided tensor (a copy when packed; exact either way)."""
        w = self.weight.detach()
        return w.to_dense() if w.is_mkldnn else w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.is_mkldnn:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            + ("bias=True, " if self.bias is not None else "")
            + ("packed=oneDNN" if self.packed else "packed=False")
        )


def pack_linears(model: nn.Module) -> int:
    """Pack every :class:`Linear` of ``model`` where possible; returns how many were packed."""
    return sum(m.pack() for m in model.modules() if isinstance(m, Linear))
