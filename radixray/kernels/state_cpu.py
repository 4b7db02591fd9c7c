"""The state layers' decode updates in place on the state pool: the CPU path beside the
references in state_reference.py (which compute on a gathered copy of the slots' states).

The references' decode forms take the batch's states as one tensor, so a caller gathers them
from the pool (``index_select``), updates the copy and scatters it back (``index_copy_``). For
Mamba2 the SSM state is large (``heads * head_dim * state_size`` floats per slot: 786 KB at 24
heads of 64 and state 128), and every extra pass over it costs as much as the update itself:
gather, the decayed state, the outer product, their sum, the copy into the gathered tensor, the
scatter and the read for ``y`` make ~12 passes. Here each run of consecutive slots is a view of
the pool, and the update is two in-place passes and one read::

    pool  [s0 s1 s2 s3 s4 s5 ...]     decode slots 2, 3, 4 and 0, in batch order
             ^^^^^^^^              runs: (row 0, slot 2, 3 slots), (row 3, slot 0, 1 slot)

    S.mul_(exp(dt * A))                       per (slot, head): [head_dim, state_size]
    S.addcmul_(x * dt (col), B (row))         the rank-1 update, in place
    y = (C (row) @ S^T)^T + D * x             one batched vector-matrix product

``y`` is formed as ``C^T S^T`` because torch's CPU bmm is ~8x faster on that layout than on
``S @ C`` with its single output column (measured: 0.2 vs 1.6 ms at 192 matrices of 64 x 128),
and addcmul_ is ~2x faster than baddbmm_ for the rank-1 update. The arithmetic is the
reference's (one product and one sum per state element; ``y`` a sum over the state size, in
another order, possibly fused), so results agree to float rounding; the tests hold them to
1e-5. A fragmented slot list costs a loop over its runs (a few small ops per run), never a copy
of the states.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F

__all__ = ["SlotRun", "conv_update_slots", "slot_runs", "ssd_update_slots"]


class SlotRun(NamedTuple):
    """Rows ``row:row + count`` of the decode batch own slots ``slot:slot + count``."""

    row: int
    slot: int
    count: int


def slot_runs(slots: Sequence[int]) -> tuple[SlotRun, ...]:
    """The decode batch's slots (in batch order) cut into runs of consecutive slot ids."""
    runs: list[SlotRun] = []
    for row, slot in enumerate(slots):
        if runs and slot == runs[-1].slot + runs[-1].count:
            runs[-1] = runs[-1]._replace(count=runs[-1].count + 1)
        else:
            runs.append(SlotRun(row, slot, 1))
    return tuple(runs)


def conv_update_slots(
    x: torch.Tensor,  # [B, C] one new input per sequence
    weight: torch.Tensor,  # [C, K]
    bias: torch.Tensor | None,  # [C]
    conv_state: torch.Tensor,  # [slots, C, K-1] the pool's, updated in place at the runs
    runs: Sequence[SlotRun],
    silu: bool = False,
) -> torch.Tensor:  # [B, C] in x's dtype
    """:func:`~radixray.kernels.state_reference.causal_conv1d_update` on the pool's slots."""
    w, out = weight.float(), torch.empty_like(x)
    for row, slot, n in runs:
        state = conv_state[slot : slot + n]  # a view: written in place below
        xs = torch.cat((state.float(), x[row : row + n].float()[:, :, None]), dim=2)  # [n, C, K]
        y = (xs * w).sum(-1)
        if bias is not None:
            y = y + bias.float()
        out[row : row + n] = F.silu(y) if silu else y
        state.copy_(xs[:, :, 1:])
    return out


def _per_head(m: torch.Tensor, num_heads: int) -> torch.Tensor:
    """B or C ``[n, G, N]`` -> ``[n, H, N]`` (head ``h`` reads group ``h // (H // G)``)."""
    n, G, N = m.shape
    return m.float()[:, :, None, :].expand(n, G, num_heads // G, N).reshape(n, num_heads, N)


def ssd_update_slots(
    ssm_state: torch.Tensor,  # [slots, H, P, N] the pool's, float32, updated in place at runs
    runs: Sequence[SlotRun],
    x: torch.Tensor,  # [B, H, P]
    dt: torch.Tensor,  # [B, H] after mamba_dt
    A: torch.Tensor,  # [H]
    B: torch.Tensor,  # [B, G, N]
    C: torch.Tensor,  # [B, G, N]
    D: torch.Tensor | None,  # [H]
) -> torch.Tensor:  # y [B, H, P] in x's dtype
    """:func:`~radixray.kernels.state_reference.ssd_update` on the pool's slots."""
    if ssm_state.dtype != torch.float32 or not ssm_state.is_contiguous():
        raise ValueError(
            f"ssm_state must be a contiguous float32 pool, got {ssm_state.dtype}, "
            f"contiguous={ssm_state.is_contiguous()}"
        )
    Bt, H, P = x.shape
    N = ssm_state.shape[-1]
    xf, dtf = x.float(), dt.float()
    decay = (dtf * A.float()).exp()  # [B, H]
    xdt = (xf * dtf[:, :, None]).reshape(Bt * H, P, 1)
    Bh = _per_head(B, H).reshape(Bt * H, 1, N)
    Ch = _per_head(C, H).reshape(Bt * H, 1, N)
    y = torch.empty(Bt * H, 1, P, dtype=torch.float32, device=x.device)
    for row, slot, n in runs:
        rows = slice(row * H, (row + n) * H)
        state = ssm_state[slot : slot + n].view(n * H, P, N)  # a view of the pool
        state.mul_(decay[row : row + n].reshape(n * H, 1, 1))
        state.addcmul_(xdt[rows], Bh[rows])
        torch.bmm(Ch[rows], state.transpose(1, 2), out=y[rows])
    y = y.view(Bt, H, P)
    if D is not None:
        y = y + xf * D.float()[:, None]
    return y.to(x.dtype)
