"""Plain-PyTorch references for the recurrent-state layers' kernels (as reference.py is for
attention): the causal depthwise conv1d with its state (LFM2's short convolution, Mamba2's
conv) and Mamba2's selective state space scan (SSD), each as a multi-token form for prefill
and a one-token form for decode. One sequence per prefill call; decode calls take a batch.

Conv state: the last ``K - 1`` inputs before the chunk, oldest first::

    state [C, K-1] | x [L, C]          ->  out[t] = bias + sum_k w[:, k] * xs[t + k]
    xs = [s0 s1 | x0 x1 x2 ...]            new state = the last K-1 rows of xs

SSM (per head ``h``; ``a_t = dt_t * A_h <= 0``)::

    S_t = exp(a_t) * S_{t-1} + dt_t * x_t (outer) B_t        S: [head_dim, state_size]
    y_t = S_t @ C_t + D_h * x_t

The chunked form (SSD, Dao and Gu 2024) computes a chunk of ``l`` steps at once: within the
chunk, ``y_t = sum_{s<=t} exp(seg[t, s]) * dt_s * (C_t . B_s) * x_s`` with
``seg[t, s] = a_{s+1} + ... + a_t`` (a masked, attention-like product), plus the incoming
state's share ``exp(a_0 + ... + a_t) * S_in @ C_t``; the state after the chunk is
``exp(sum a) * S_in + sum_s exp(seg[l-1, s]) * dt_s * x_s (outer) B_s``. Segment sums are
summed directly, never as differences of running sums, which lose precision once the running
sum is large. Everything is computed in float32; outputs come back in x's dtype; states are
written in their own dtype.
"""

from __future__ import annotations

from itertools import pairwise

import torch
import torch.nn.functional as F

__all__ = [
    "causal_conv1d",
    "causal_conv1d_update",
    "conv_state_at",
    "mamba_dt",
    "save_conv_states",
    "ssd_prefills",
    "ssd_recurrent",
    "ssd_scan",
    "ssd_scan_cut",
    "ssd_update",
]


def causal_conv1d(
    x: torch.Tensor,  # [L, C] one sequence's new inputs
    weight: torch.Tensor,  # [C, K] depthwise taps, oldest input first
    bias: torch.Tensor | None,  # [C]
    state: torch.Tensor | None,  # [C, K-1] the inputs before x; None: zeros (a fresh sequence)
    silu: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # out [L, C] in x's dtype, new state [C, K-1]
    C, K = weight.shape
    L = x.shape[0]
    if state is None:
        state = x.new_zeros(C, K - 1)
    xs = torch.cat((state.to(x.dtype), x.transpose(0, 1)), dim=1)  # [C, K-1+L]
    out = F.conv1d(xs[None].float(), weight[:, None].float(), _float(bias), groups=C)[0]
    if silu:
        out = F.silu(out)
    return out.transpose(0, 1).to(x.dtype), xs[:, L:].clone()


def conv_state_at(
    x: torch.Tensor,  # [L, C] one sequence's new inputs
    state: torch.Tensor | None,  # [C, K-1] the inputs before x; None: zeros
    offset: int,  # 0 <= offset <= L
    kernel: int,  # K
) -> torch.Tensor:  # [C, K-1] in x's dtype
    """The conv state after the first ``offset`` rows of ``x``: the last ``K - 1`` inputs
    before row ``offset``, oldest first, those before ``x`` from ``state`` when ``offset <
    K - 1``. What :func:`causal_conv1d` returns for ``x[:offset]``, without running the conv:
    a checkpoint saved inside a prefill span (``conv_varlen``'s saves)."""
    if not 0 <= offset <= x.shape[0]:
        raise ValueError(f"offset must be in [0, {x.shape[0]}] (the rows of x), got {offset}")
    k1 = kernel - 1
    rows = x[max(0, offset - k1) : offset].transpose(0, 1)  # [C, min(offset, K-1)]
    if offset >= k1:
        return rows.clone()
    before = x.new_zeros(x.shape[1], k1) if state is None else state.to(x.dtype)
    return torch.cat((before[:, offset:], rows), dim=1)


def causal_conv1d_update(
    x: torch.Tensor,  # [B, C] one new input per sequence
    weight: torch.Tensor,  # [C, K]
    bias: torch.Tensor | None,  # [C]
    state: torch.Tensor,  # [B, C, K-1], updated in place
    silu: bool = False,
) -> torch.Tensor:  # [B, C]
    xs = torch.cat((state.float(), x.float()[:, :, None]), dim=2)  # [B, C, K]
    out = (xs * weight.float()).sum(-1)
    if bias is not None:
        out = out + bias.float()
    if silu:
        out = F.silu(out)
    state.copy_(xs[:, :, 1:].to(state.dtype))
    return out.to(x.dtype)


def mamba_dt(
    dt: torch.Tensor, dt_bias: torch.Tensor, dt_min: float = 0.0, dt_max: float = float("inf")
) -> torch.Tensor:
    """Mamba2's time step from in_proj's raw ``dt [..., H]``: ``softplus(dt + dt_bias)`` clamped
    to the config's limits, in float32. The same in prefill and decode (transformers clamps only
    in its chunked path; with the default limits (0, inf) the clamp changes nothing)."""
    dt = F.softplus(dt.float() + dt_bias.float())
    if dt_min > 0.0 or dt_max != float("inf"):
        dt = dt.clamp(dt_min, dt_max)
    return dt


def _float(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.float()


def _heads(m: torch.Tensor, num_heads: int) -> torch.Tensor:
    """B or C ``[..., G, N]`` -> ``[..., H, N]``: head ``h`` reads group ``h // (H // G)``."""
    return m.float().repeat_interleave(num_heads // m.shape[-2], dim=-2)


def _segment_sums(a: torch.Tensor) -> torch.Tensor:
    """``a [l, H]`` -> ``seg [H, l, l]``: ``seg[h, t, s] = a[s+1, h] + ... + a[t, h]`` for
    ``s <= t`` (0 on the diagonal), -inf above it (no influence of the future)."""
    l = a.shape[0]  # noqa: E741
    rows = a.transpose(0, 1)[:, :, None].expand(-1, l, l)  # rows[h, k, s] = a[k, h]
    below = torch.ones(l, l, dtype=torch.bool, device=a.device).tril(-1)  # k > s
    seg = rows.masked_fill(~below, 0.0).cumsum(dim=1)  # sum over s < k <= t
    causal = torch.ones(l, l, dtype=torch.bool, device=a.device).tril()
    return seg.masked_fill(~causal, float("-inf"))


def _ssd_chunk(x, dt, A, B, C, state):
    """One chunk: ``x [l, H, P]``, ``dt [l, H]``, ``B``/``C`` ``[l, H, N]`` (per head),
    ``state [H, P, N]`` (float32) -> ``(y [l, H, P], state after the chunk)``; no D term."""
    a = dt * A  # [l, H]
    seg = _segment_sums(a)  # [H, l, l]
    scores = torch.einsum("thn,shn->hts", C, B) * seg.exp()  # [H, t, s]
    xdt = x * dt[:, :, None]  # [l, H, P]
    y = torch.einsum("hts,shp->thp", scores, xdt)
    into = a.cumsum(dim=0)  # [l, H]: a_0 + ... + a_t, the incoming state's decay at t
    y = y + torch.einsum("thn,hpn->thp", C, state) * into.exp()[:, :, None]
    to_end = seg[:, -1, :].transpose(0, 1).exp()  # [l, H]: decay from s to the chunk's end
    state = state * into[-1].exp()[:, None, None] + torch.einsum(
        "shp,shn->hpn", xdt * to_end[:, :, None], B
    )
    return y, state


def ssd_scan(
    x: torch.Tensor,  # [L, H, P] one sequence
    dt: torch.Tensor,  # [L, H] after mamba_dt
    A: torch.Tensor,  # [H] negative (-exp(A_log))
    B: torch.Tensor,  # [L, G, N]
    C: torch.Tensor,  # [L, G, N]
    D: torch.Tensor | None,  # [H] skip connection
    chunk_size: int,
    state: torch.Tensor | None = None,  # [H, P, N] before x; None: zeros
) -> tuple[torch.Tensor, torch.Tensor]:  # y [L, H, P] in x's dtype, final state [H, P, N] fp32
    L, H, P = x.shape
    s = x.new_zeros(H, P, B.shape[-1], dtype=torch.float32) if state is None else state.float()
    xf, dtf, Af = x.float(), dt.float(), A.float()
    Bh, Ch = _heads(B, H), _heads(C, H)
    ys = []
    for start in range(0, L, chunk_size):
        end = min(start + chunk_size, L)
        y, s = _ssd_chunk(xf[start:end], dtf[start:end], Af, Bh[start:end], Ch[start:end], s)
        ys.append(y)
    y = torch.cat(ys) if ys else xf.new_zeros(0, H, P)
    if D is not None:
        y = y + xf * D.float()[:, None]
    return y.to(x.dtype), s


def ssd_scan_cut(
    x: torch.Tensor,  # [L, H, P] one sequence
    dt: torch.Tensor,  # [L, H] after mamba_dt
    A: torch.Tensor,  # [H]
    B: torch.Tensor,  # [L, G, N]
    C: torch.Tensor,  # [L, G, N]
    D: torch.Tensor | None,  # [H]
    chunk_size: int,
    state: torch.Tensor | None,  # [H, P, N] before x; None: zeros
    cuts: list[int] | tuple[int, ...],  # increasing, each in (0, L)
) -> tuple[torch.Tensor, list[torch.Tensor]]:  # y [L, H, P]; the states after each cut, then L
    """:func:`ssd_scan` in sub-spans split at ``cuts``, each from the one before's final
    state: the states after ``cuts[i]`` rows (float32) are the state checkpoints a prefill
    span saves inside the forward, the last one is the span's final state. The same scans as
    running each sub-span as its own step (a prefill chunk cut at each point), so the result is
    bitwise that of the cut chunks: the scan's chunks restart at each cut, as they would at a
    step's first token."""
    bounds = [0, *cuts, x.shape[0]]
    if cuts and any(b >= e for b, e in pairwise(bounds)):
        raise ValueError(f"cuts must increase strictly within (0, {x.shape[0]}), got {cuts}")
    ys, states = [], []
    for b, e in pairwise(bounds):
        y, state = ssd_scan(x[b:e], dt[b:e], A, B[b:e], C[b:e], D, chunk_size, state)
        ys.append(y)
        states.append(state)
    return (torch.cat(ys) if len(ys) > 1 else ys[0]), states


def ssd_update(
    state: torch.Tensor,  # [B, H, P, N], updated in place
    x: torch.Tensor,  # [B, H, P]
    dt: torch.Tensor,  # [B, H] after mamba_dt
    A: torch.Tensor,  # [H]
    B: torch.Tensor,  # [B, G, N]
    C: torch.Tensor,  # [B, G, N]
    D: torch.Tensor | None,  # [H]
) -> torch.Tensor:  # y [B, H, P] in x's dtype
    H = x.shape[1]
    xf, dtf = x.float(), dt.float()
    decay = (dtf * A.float()).exp()[:, :, None, None]  # [B, H, 1, 1]
    s = state.float() * decay + (xf * dtf[:, :, None])[..., None] * _heads(B, H)[:, :, None, :]
    state.copy_(s.to(state.dtype))
    y = torch.einsum("bhpn,bhn->bhp", s, _heads(C, H))
    if D is not None:
        y = y + xf * D.float()[:, None]
    return y.to(x.dtype)


def ssd_recurrent(x, dt, A, B, C, D, state=None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`ssd_scan`'s result one step at a time with :func:`ssd_update` (the definition,
    to test the chunked form against; slow)."""
    L, H, P = x.shape
    s = x.new_zeros(1, H, P, B.shape[-1], dtype=torch.float32)
    if state is not None:
        s[0] = state.float()
    ys = [
        ssd_update(s, x[t : t + 1], dt[t : t + 1], A, B[t : t + 1], C[t : t + 1], D)
        for t in range(L)
    ]
    y = torch.cat(ys) if ys else x.new_zeros(0, H, P)
    return y, s[0]


def save_conv_states(u: torch.Tensor, kernel: int, spans, conv_state: torch.Tensor) -> None:
    """Every prefill span's in-forward saves of the conv state (``SeqSpan.saves``: offset,
    slot): ``conv_state[slot]`` gets :func:`conv_state_at` of the span's rows of ``u [T, C]``.
    Run before the conv writes the spans' own slots: a save within ``K - 1`` rows of its
    span's start reads the span's initial state there."""
    for span in spans:
        if span.saves:
            x = u[span.start : span.end]
            initial = conv_state[span.slot] if span.has_initial else None
            for offset, slot in span.saves:
                conv_state[slot] = conv_state_at(x, initial, offset, kernel)


def ssd_prefills(x, dt, A, B, C, D, chunk_size, spans, ssm_state, y) -> None:
    """Every prefill span (``SeqSpan``) through :func:`ssd_scan_cut` at its saves' offsets,
    each from its slot's state (zeros without one): ``y`` gets the span's rows, each save's slot
    the state after its offset, the span's slot its final state. ``x``, ``dt``, ``B``, ``C``,
    ``y`` are the step's flat rows; ``ssm_state`` the pool's ``[slots, H, P, N]``."""
    for span in spans:
        s, e = span.start, span.end
        initial = ssm_state[span.slot] if span.has_initial else None
        cuts = [offset for offset, _ in span.saves]
        y[s:e], states = ssd_scan_cut(
            x[s:e], dt[s:e], A, B[s:e], C[s:e], D, chunk_size, initial, cuts
        )
        for (_, slot), state in zip(span.saves, states, strict=False):
            ssm_state[slot] = state
        ssm_state[span.slot] = states[-1]
