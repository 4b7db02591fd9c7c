"""The recurrent-state mixers of hybrid models, in place of attention in their layers
(model_meta/state_layers.py describes them): LFM2's gated short convolution and Mamba2's mixer
(Granite 4.0-H). Both run the step's flat varlen batch against the state pool: token-wise
projections over all rows at once, then the conv and the scan per sequence
(state_metadata.py): one batched update for the decode rows, one chunk call per prefill.

The kernels are the plain-PyTorch references (kernels/state_reference.py), but for the decode
rows on CPU, which update the pool's slots in place (kernels/state_cpu.py: no gather and
scatter of the states, the SSM's large one above all), and for CUDA tensors, which run
kernels/triton_state.py where Triton imports. Parameters keep
transformers' shapes (the conv weight ``[channels, 1, kernel]``), so weights load and export
as they are (hybrid_weights.py).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from radixray.kernels.state_cpu import conv_update_slots, ssd_update_slots
from radixray.kernels.state_reference import (
    causal_conv1d,
    causal_conv1d_update,
    mamba_dt,
    save_conv_states,
    ssd_prefills,
    ssd_update,
)
from radixray.model_meta.model_config import ModelConfig

from .linear import Linear
from .state_metadata import StateBatch, StateMetadata

__all__ = ["Mamba2Mixer", "ShortConv", "gated_rms_norm", "state_mixer"]


def _param(*shape: int, device=None) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, device=device), requires_grad=False)


@functools.cache
def _triton_state():
    """kernels/triton_state.py (the Triton path for CUDA tensors), None where Triton does not
    import: the references then run on CUDA too."""
    try:
        from radixray.kernels import triton_state
    except ImportError:
        return None
    return triton_state


def conv_varlen(
    u: torch.Tensor,  # [T, C] the step's rows
    weight: torch.Tensor,  # [C, K]
    bias: torch.Tensor | None,
    silu: bool,
    meta: StateMetadata,
    conv_state: torch.Tensor,  # [slots, C, K-1], read and written at the step's slots
) -> torch.Tensor:  # [T, C]
    """The causal depthwise conv over every sequence of the step, each from its own state; a
    prefill span's saves (``SeqSpan.saves``) get the state at their offsets."""
    if u.is_cuda and _triton_state():  # the same plan in two launches (docs/models.md)
        return _triton_state().conv_varlen(u, weight, bias, silu, meta, conv_state)
    if meta.num_decode and not meta.prefills and u.device.type == "cpu":  # rows == decode rows
        return conv_update_slots(u, weight, bias, conv_state, meta.decode_runs, silu)
    out = torch.empty_like(u)
    if meta.num_decode and u.device.type == "cpu":
        rows = meta.decode_rows
        out[rows] = conv_update_slots(u[rows], weight, bias, conv_state, meta.decode_runs, silu)
    elif meta.num_decode:
        rows, slots = meta.decode_rows, meta.decode_slots
        state = conv_state.index_select(0, slots)
        out[rows] = causal_conv1d_update(u[rows], weight, bias, state, silu)
        conv_state.index_copy_(0, slots, state)
    save_conv_states(u, weight.shape[1], meta.prefills, conv_state)  # before the slots change
    for span in meta.prefills:
        start, end = span.start, span.end
        initial = conv_state[span.slot] if span.has_initial else None
        out[start:end], last = causal_conv1d(u[start:end], weight, bias, initial, silu)
        conv_state[span.slot] = last
    return out


def ssd_varlen(
    x: torch.Tensor,  # [T, H, P]
    dt: torch.Tensor,  # [T, H] after mamba_dt
    A: torch.Tensor,  # [H]
    B: torch.Tensor,  # [T, G, N]
    C: torch.Tensor,  # [T, G, N]
    D: torch.Tensor,  # [H]
    chunk_size: int,
    meta: StateMetadata,
    ssm_state: torch.Tensor,  # [slots, H, P, N]
) -> torch.Tensor:  # [T, H, P]
    """Mamba2's scan over every sequence of the step, each from its own state; a prefill span
    is scanned in sub-spans split at its saves, each save's slot getting the state there."""
    if x.is_cuda and _triton_state():  # decode rows in one launch; prefill as below
        return _triton_state().ssd_varlen(x, dt, A, B, C, D, chunk_size, meta, ssm_state)
    if meta.num_decode and not meta.prefills and x.device.type == "cpu":  # rows == decode rows
        return ssd_update_slots(ssm_state, meta.decode_runs, x, dt, A, B, C, D)
    y = torch.empty_like(x)
    if meta.num_decode and x.device.type == "cpu":
        r = meta.decode_rows
        y[r] = ssd_update_slots(ssm_state, meta.decode_runs, x[r], dt[r], A, B[r], C[r], D)
    elif meta.num_decode:
        rows, slots = meta.decode_rows, meta.decode_slots
        state = ssm_state.index_select(0, slots)
        y[rows] = ssd_update(state, x[rows], dt[rows], A, B[rows], C[rows], D)
        ssm_state.index_copy_(0, slots, state)
    ssd_prefills(x, dt, A, B, C, D, chunk_size, meta.prefills, ssm_state, y)
    return y


def gated_rms_norm(
    y: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, groups: int, eps: float
) -> torch.Tensor:
    """``weight * rms_norm(y * silu(z))`` with the norm taken over each of ``groups`` equal
    slices of the channels (Mamba2's gate before the norm, ``norm_before_gate=False``); in
    float32, scaled in y's dtype (as transformers does)."""
    g = y.float() * F.silu(z.float())
    shape = g.shape
    g = g.view(*shape[:-1], groups, shape[-1] // groups)
    g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + eps)
    return weight * g.view(shape).to(y.dtype)


class ShortConv(nn.Module):
    """LFM2's gated short convolution: ``out_proj(C * conv(B * x))`` with ``B, C, x`` from one
    projection; the conv's state is the layer's only state."""

    def __init__(self, cfg: ModelConfig, layer: int, device=None) -> None:
        super().__init__()
        spec, H = cfg.short_conv, cfg.hidden_size
        self.layer = layer
        self.in_proj = Linear(H, 3 * H, device, bias=spec.bias)
        self.conv_weight = _param(H, 1, spec.kernel, device=device)
        self.conv_bias = _param(H, device=device) if spec.bias else None
        self.out_proj = Linear(H, H, device, bias=spec.bias)

    def forward(self, h: torch.Tensor, state: StateBatch) -> torch.Tensor:
        b, c, x = self.in_proj(h).chunk(3, dim=-1)
        conv = state.pool.conv_state(self.layer)
        y = conv_varlen(b * x, self.conv_weight[:, 0], self.conv_bias, False, state.meta, conv)
        return self.out_proj(c * y)


class Mamba2Mixer(nn.Module):
    """Mamba2's mixer (model_meta/state_layers.Mamba2Spec has the formula): a conv state and an
    SSM state per sequence."""

    def __init__(self, cfg: ModelConfig, layer: int, device=None) -> None:
        super().__init__()
        s = self.spec = cfg.mamba
        self.layer, self.eps = layer, cfg.rms_norm_eps
        self.in_proj = Linear(cfg.hidden_size, s.in_proj_size, device, bias=s.proj_bias)
        self.conv_weight = _param(s.conv_dim, 1, s.conv_kernel, device=device)
        self.conv_bias = _param(s.conv_dim, device=device) if s.conv_bias else None
        self.dt_bias = _param(s.num_heads, device=device)
        self.A_log = _param(s.num_heads, device=device)
        self.D = _param(s.num_heads, device=device)
        self.norm_weight = _param(s.inner, device=device)
        self.out_proj = Linear(s.inner, cfg.hidden_size, device, bias=s.proj_bias)

    def forward(self, h: torch.Tensor, state: StateBatch) -> torch.Tensor:
        s, T = self.spec, h.shape[0]
        GN = s.n_groups * s.state_size
        z, xbc, dt = self.in_proj(h).split([s.inner, s.conv_dim, s.num_heads], dim=-1)
        conv = state.pool.conv_state(self.layer)
        xbc = conv_varlen(xbc, self.conv_weight[:, 0], self.conv_bias, True, state.meta, conv)
        x, B, C = xbc.split([s.inner, GN, GN], dim=-1)
        y = ssd_varlen(
            x.reshape(T, s.num_heads, s.head_dim),
            mamba_dt(dt, self.dt_bias, s.dt_min, s.dt_max),
            -torch.exp(self.A_log.float()),
            B.reshape(T, s.n_groups, s.state_size),
            C.reshape(T, s.n_groups, s.state_size),
            self.D,
            s.chunk_size,
            state.meta,
            state.pool.ssm_state(self.layer),
        )
        y = gated_rms_norm(y.reshape(T, s.inner), z, self.norm_weight, s.n_groups, self.eps)
        return self.out_proj(y)


def state_mixer(cfg: ModelConfig, layer: int, device=None) -> nn.Module | None:
    """Layer ``layer``'s state mixer, or None for an attention layer."""
    kind = cfg.layer_kind(layer)
    if kind == "conv":
        return ShortConv(cfg, layer, device)
    if kind == "mamba":
        return Mamba2Mixer(cfg, layer, device)
    return None
