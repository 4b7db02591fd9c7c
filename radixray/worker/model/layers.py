"""The building blocks every member of the decoder family shares: RMSNorm (Gemma's ``1 + w``
form too), rotate-half RoPE (with linear scaling) and the gated MLP (SwiGLU, or Gemma's GeGLU;
also each expert of a sparse MoE)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .linear import Linear

__all__ = ["MLP", "RMSNorm", "RotaryEmbedding", "apply_rope"]


class RMSNorm(nn.Module):
    """``x / rms(x) * (offset + weight)``: ``offset`` 0 (Llama, Qwen) or 1 (Gemma, whose
    checkpoints store ``w`` for a scale of ``1 + w``)."""

    def __init__(self, size: int, eps: float, device=None, offset: float = 0.0) -> None:
        super().__init__()
        self.eps, self.offset = eps, offset
        self.weight = nn.Parameter(torch.empty(size, device=device), requires_grad=False)
        # kernels/triton_norm.rms_norm and add_rms_norm once the model runner has checked them
        # on this device (a bf16 / fp16 model on CUDA): one kernel for the eight below
        self.fused = None
        self.fused_add = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.offset:
            # Gemma's order: normalise and scale in float32, then cast (as transformers does).
            xf = x.float()
            xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
            return (xf * (self.offset + self.weight.float())).to(x.dtype)
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            # the same formula in one fused op (one pass over x instead of six small ops)
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        if self.fused is not None:
            return self.fused(x, self.weight, self.eps)
        # Normalise in float32 whatever the dtype, then scale in the model dtype (as HF does).
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(s, norm(s))`` for ``s = x + residual``: in one kernel where fused."""
        if self.fused_add is not None and x.dim() == 2:
            return self.fused_add(x, residual, self.weight, self.eps)
        s = x + residual
        return s, self(s)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for every position up to ``max_position_embeddings``, non-interleaved;
    ``factor`` > 1 is linear scaling (positions divided by it, as Gemma 3's global layers do),
    ``freq_factors`` divide each frequency by its own factor (model_meta/rope_scaling.py)."""

    def __init__(
        self,
        head_dim: int,
        theta: float,
        max_positions: int,
        device=None,
        factor: float = 1.0,
        freq_factors: tuple[float, ...] = (),
    ) -> None:
        super().__init__()
        # float64 for the angles: position * frequency loses ~1e-3 rad in float32 at 8k positions.
        inv_freq = 1.0 / (
            theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)
        )
        inv_freq = inv_freq / factor
        if freq_factors:  # per-frequency divisors (Llama 3.1's scaling, a GGUF's rope_freqs)
            inv_freq = inv_freq / torch.tensor(freq_factors, dtype=torch.float64, device=device)
        angles = torch.arange(max_positions, dtype=torch.float64, device=device)[:, None] * inv_freq
        self.register_buffer("cos", angles.cos().float(), persistent=False)  # [max_pos, D/2]
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(c, s)`` ``[T, 1, D]`` (float32) for ``positions [T]`` (< max_positions), in the
        form :func:`apply_rope` takes: ``c = [cos, cos]``, ``s = [-sin, sin]`` over the two
        halves (built once per step; the tables keep one half each)."""
        cos, sin = self.cos[positions], self.sin[positions]
        return torch.cat((cos, cos), -1)[:, None, :], torch.cat((-sin, sin), -1)[:, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on ``x [T, H, D]``: pairs are (i, i + D/2), computed in float32, with
    ``cos``, ``sin`` as :class:`RotaryEmbedding` gives them (``[cos, cos]``, ``[-sin, sin]``).

    ``x * c + rotate(x) * s`` with ``rotate(x) = [x2, x1]``: ``x1 cos - x2 sin`` and ``x2 cos +
    x1 sin``, each rounded exactly as written out (``a + b * -s`` is ``a - b * s`` in IEEE
    arithmetic), in six kernels on a GPU where the written-out form takes nine."""
    half = x.shape[-1] // 2
    xf = x.float()
    rotated = torch.cat((xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


class MLP(nn.Module):
    """``down(act(gate(h)) * up(h))``, gate and up fused into one matmul; ``act`` SiLU (SwiGLU)
    or tanh-approximated GELU (GeGLU, Gemma's ``gelu_pytorch_tanh``)."""

    def __init__(
        self, hidden_size: int, intermediate_size: int, device=None, act: str = "silu"
    ) -> None:
        super().__init__()
        self.intermediate_size = intermediate_size
        self.gelu = act == "gelu_tanh"
        self.gate_up_proj = Linear(hidden_size, 2 * intermediate_size, device)
        self.down_proj = Linear(intermediate_size, hidden_size, device)
        # kernels/triton_act.silu_and_mul once the model runner has checked it (SwiGLU, a
        # 16-bit model on CUDA): the activation and the product in one kernel
        self.fused_act = None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.fused_act is not None and h.dim() == 2:
            return self.down_proj(self.fused_act(self.gate_up_proj(h)))
        gate, up = self.gate_up_proj(h).split(self.intermediate_size, dim=-1)
        gate = F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)
        return self.down_proj(gate * up)
