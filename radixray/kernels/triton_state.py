"""The recurrent-state layers' kernels in Triton (CUDA): drop-in replacements of
``worker/model/state_layers.conv_varlen`` and ``ssd_varlen``, with the same signatures, checked
against kernels/state_reference.py (tests/kernels/test_triton_state.py).

What runs where, for one step's flat varlen batch (state_metadata.py draws it)::

    rows    [a5 a6 a7 | b9 | c0 c1 c2 c3 | d4]     decode: b, d      prefill spans: a, c
    conv    one launch for every prefill span  +  one launch for every decode row
    scan    one launch for every decode row (the decode hot path: state read, updated in place,
            y written)  +  the reference's chunked scan, per prefill span

- The conv (:func:`conv_varlen`): one program per (sequence, channel block, time block). Each
  output row reads its ``K`` inputs straight from the batch, or, for the first ``K - 1`` rows of
  a sequence, from its slot's conv state (zeros for a sequence with no context: a fresh slot's
  stale contents are never read). The program of a sequence's first time block also writes the
  sequence's new state (the last ``K - 1`` inputs), after a barrier: it is the only program that
  reads the old state (time blocks hold at least ``K - 1`` rows), so the update in place races
  with nothing. Decode rows run through the same kernel, one row per sequence, with the step's
  ``decode_rows`` / ``decode_slots`` as they are (no host data: CUDA graphs can capture it).
- The scan's decode update (:func:`ssd_decode`): one program per (row, head, block of the head
  dim) holds a ``[BLOCK_P, N]`` tile of the slot's state in float32, decays it, adds
  ``dt * x (outer) B``, writes it back in place, and reduces it against ``C`` for ``y``: the
  state is read once and written once, which is all a decode step must move.
- The scan's prefill stays the reference's chunked formulation (state_reference.ssd_scan) on
  CUDA: it is a handful of batched matmuls per chunk (einsums that cuBLAS runs on tensor cores),
  so the work is already on the GPU's fast path; a Triton chunked scan (mamba_ssm splits it into
  five kernels: chunk cumsum, chunk states, state passing, chunk scan, and their varlen
  bookkeeping) would save launches on long prompts, not arithmetic, and is left for when a
  profile shows the prefill scan matters.

Accumulation is float32 throughout; outputs are cast to the input's dtype and states to the
pool's, as the reference does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from radixray.kernels.state_reference import save_conv_states, ssd_prefills

if TYPE_CHECKING:
    from radixray.worker.model.state_metadata import StateMetadata

__all__ = ["conv_varlen", "ssd_decode", "ssd_varlen"]

_CONV_BLOCK_T = 32  # prefill rows a program computes (>= K - 1, see the module docstring)
_CONV_BLOCK_C = 128  # channels a program computes: [32, 128] fp32 is 16 KB of registers
_DECODE_BLOCK_C = 512  # decode programs hold one row: wider in channels instead
_SSD_BLOCK_P = 16  # head-dim rows of the state a decode program holds ([16, 128] fp32: 8 KB)


@triton.jit
def _conv_kernel(
    u_ptr,  # [T, C] the step's rows (a row stride, channels contiguous or not)
    w_ptr,  # [C, K] taps, oldest input first
    bias_ptr,  # [C] (unused without HAS_BIAS)
    out_ptr,  # [T, C] contiguous
    state_ptr,  # [slots, C, K-1] read and written at the sequences' slots
    seq_ptr,  # DECODE: int64 [n] rows; else int32 [n, 4]: start, length, slot, has_initial
    slot_ptr,  # DECODE: int64 [n] slots (else unused)
    stride_ut,
    stride_uc,
    stride_wc,
    stride_wk,
    stride_sn,
    stride_sc,
    stride_sk,
    C,
    K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    DECODE: tl.constexpr,  # one row per sequence, always from its state
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_S: tl.constexpr,  # K - 1 padded to a power of two
):
    i, cb, tb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if DECODE:
        start = tl.load(seq_ptr + i)
        slot = tl.load(slot_ptr + i)
        length = 1
        has_init = 1
    else:
        start = tl.load(seq_ptr + i * 4).to(tl.int64)
        length = tl.load(seq_ptr + i * 4 + 1)
        slot = tl.load(seq_ptr + i * 4 + 2).to(tl.int64)
        has_init = tl.load(seq_ptr + i * 4 + 3)
    if tb * BLOCK_T >= length:
        return
    offs_c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = offs_c < C
    t = tb * BLOCK_T + tl.arange(0, BLOCK_T)
    state = state_ptr + slot * stride_sn + offs_c[None, :] * stride_sc
    # the has_initial flag broadcast to a vector: a scalar in a tensor mask trips the interpreter
    init = (tl.zeros([BLOCK_T], dtype=tl.int32) + has_init) != 0
    acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    for k in tl.static_range(K):
        pos = t + (k - (K - 1))  # the input this tap reads; < 0: from the state
        m_x = ((pos >= 0) & (pos < length))[:, None] & c_ok[None, :]
        xv = tl.load(
            u_ptr + (start + pos)[:, None] * stride_ut + offs_c[None, :] * stride_uc,
            mask=m_x,
            other=0.0,
        ).to(tl.float32)
        m_s = ((pos < 0) & init)[:, None] & c_ok[None, :]
        sv = tl.load(state + (pos + (K - 1))[:, None] * stride_sk, mask=m_s, other=0.0)
        if not DECODE:  # as the reference's prefill, which joins the state to x in x's dtype
            sv = sv.to(u_ptr.dtype.element_ty)
        w = tl.load(w_ptr + offs_c * stride_wc + k * stride_wk, mask=c_ok, other=0.0)
        acc += tl.where(m_x, xv, sv.to(tl.float32)) * w.to(tl.float32)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    if SILU:
        acc = acc * tl.sigmoid(acc)
    m_out = (t < length)[:, None] & c_ok[None, :]
    tl.store(
        out_ptr + (start + t)[:, None] * C + offs_c[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=m_out,
    )
    if tb == 0:  # the one program of these channels that reads the old state writes the new
        _conv_new_state(u_ptr, state, start, length, has_init, offs_c, c_ok,
                        stride_ut, stride_uc, stride_sk, K, DECODE, BLOCK_S)  # fmt: skip


@triton.jit
def _conv_new_state(
    u_ptr, state, start, length, has_init, offs_c, c_ok, stride_ut, stride_uc, stride_sk,
    K: tl.constexpr, DECODE: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    """A sequence's new conv state: its inputs ``length-K+1 .. length-1``, those before its
    first from the old state (a sequence shorter than ``K - 1``), written over the old."""
    j = tl.arange(0, BLOCK_S)
    pos = length + j - (K - 1)
    j_ok = j < K - 1
    init = (tl.zeros([BLOCK_S], dtype=tl.int32) + has_init) != 0
    m_x = (j_ok & (pos >= 0))[:, None] & c_ok[None, :]
    m_s = (j_ok & (pos < 0) & init)[:, None] & c_ok[None, :]
    xv = tl.load(
        u_ptr + (start + pos)[:, None] * stride_ut + offs_c[None, :] * stride_uc,
        mask=m_x,
        other=0.0,
    )
    sv = tl.load(state + (length + j)[:, None] * stride_sk, mask=m_s, other=0.0)
    if not DECODE:  # as the reference's prefill: the old state joined to x in x's dtype
        sv = sv.to(u_ptr.dtype.element_ty)
    new = tl.where(m_x, xv.to(state.dtype.element_ty), sv.to(state.dtype.element_ty))
    tl.debug_barrier()  # every read of the old state (by any thread) before the write
    tl.store(state + j[:, None] * stride_sk, new, mask=j_ok[:, None] & c_ok[None, :])


def _launch_conv(u, weight, bias, silu, conv_state, out, seqs, slots, n, max_len, decode):
    C, K = weight.shape
    block_t = 2 if decode else max(_CONV_BLOCK_T, triton.next_power_of_2(K - 1))
    block_c = min(_DECODE_BLOCK_C if decode else _CONV_BLOCK_C, triton.next_power_of_2(C))
    grid = (n, triton.cdiv(C, block_c), triton.cdiv(max_len, block_t))
    _conv_kernel[grid](
        u,
        weight,
        bias if bias is not None else weight,  # a valid pointer, never read
        out,
        conv_state,
        seqs,
        slots,
        u.stride(0),
        u.stride(1),
        weight.stride(0),
        weight.stride(1),
        conv_state.stride(0),
        conv_state.stride(1),
        conv_state.stride(2),
        C,
        K=K,
        HAS_BIAS=bias is not None,
        SILU=silu,
        DECODE=decode,
        BLOCK_T=block_t,
        BLOCK_C=block_c,
        BLOCK_S=triton.next_power_of_2(max(K - 1, 1)),
        num_warps=4,
    )


def _check_conv(u: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor) -> None:
    C, K = weight.shape
    if u.dim() != 2 or u.shape[1] != C:
        raise ValueError(f"u must be [tokens, {C}] (the weight's channels), got {tuple(u.shape)}")
    if K < 2 or conv_state.dim() != 3 or tuple(conv_state.shape[1:]) != (C, K - 1):
        raise ValueError(
            f"conv_state must be [slots, {C}, {K - 1}] for a [{C}, {K}] weight (K >= 2), "
            f"got {tuple(conv_state.shape)}"
        )


def conv_varlen(
    u: torch.Tensor,  # [T, C] the step's rows
    weight: torch.Tensor,  # [C, K]
    bias: torch.Tensor | None,  # [C]
    silu: bool,
    meta: StateMetadata,
    conv_state: torch.Tensor,  # [slots, C, K-1], read and written at the step's slots
) -> torch.Tensor:  # [T, C] in u's dtype
    """state_layers.conv_varlen in at most two launches: every prefill span, every decode row
    (the prefill spans' in-forward saves in PyTorch before them: a save near a span's start
    reads the initial state the launch overwrites)."""
    _check_conv(u, weight, conv_state)
    out = torch.empty(u.shape, dtype=u.dtype, device=u.device)
    save_conv_states(u, weight.shape[1], meta.prefills, conv_state)  # PyTorch, before the kernels
    if meta.num_decode:
        rows, slots = meta.decode_rows, meta.decode_slots
        _launch_conv(u, weight, bias, silu, conv_state, out, rows, slots, len(rows), 1, True)
    if meta.prefills:
        seqs, max_len = _prefill_table(meta, u.device)
        n = len(meta.prefills)
        _launch_conv(u, weight, bias, silu, conv_state, out, seqs, seqs, n, max_len, False)
    return out


_last_table: list = [None, None, None]  # (meta, device table, longest span) of the last call


def _prefill_table(meta: StateMetadata, device: torch.device) -> tuple[torch.Tensor, int]:
    """The prefill spans as an int32 ``[n, 4]`` device table (start, length, slot,
    has_initial) and the longest span's length. Every state layer of a step gets the same
    ``meta``: the table is uploaded once a step, not once a layer. The copy does not wait for
    the device (worker/model/upload.py's way; inlined to keep kernels/ free of the worker)."""
    if _last_table[0] is meta and _last_table[1].device == device:
        return _last_table[1], _last_table[2]
    rows = [(s.start, s.end - s.start, s.slot, int(s.has_initial)) for s in meta.prefills]
    t = torch.tensor(rows, dtype=torch.int32)
    t = t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)
    _last_table[:] = [meta, t, max(r[1] for r in rows)]
    return t, _last_table[2]


@triton.jit
def _ssd_decode_kernel(
    state_ptr,  # [slots, H, P, N] updated in place
    x_ptr,  # [T, H, P]
    dt_ptr,  # [T, H] after mamba_dt
    a_ptr,  # [H]
    b_ptr,  # [T, G, N]
    c_ptr,  # [T, G, N]
    d_ptr,  # [H] (unused without HAS_D)
    y_ptr,  # [T, H, P] contiguous
    rows_ptr,  # int64 [n] the decode rows
    slots_ptr,  # int64 [n] their slots
    stride_sn,
    stride_sh,
    stride_sp,
    stride_sk,
    stride_xt,
    stride_xh,
    stride_xp,
    stride_dtt,
    stride_dth,
    stride_bt,
    stride_bg,
    stride_bn,
    stride_ct,
    stride_cg,
    stride_cn,
    H,
    P,
    N,
    HEADS_PER_GROUP: tl.constexpr,
    HAS_D: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    i, h, pb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    row = tl.load(rows_ptr + i)
    slot = tl.load(slots_ptr + i)
    g = h // HEADS_PER_GROUP
    offs_p = pb * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    p_ok, n_ok = offs_p < P, offs_n < N
    m = p_ok[:, None] & n_ok[None, :]
    dt = tl.load(dt_ptr + row * stride_dtt + h * stride_dth).to(tl.float32)
    decay = tl.exp(dt * tl.load(a_ptr + h).to(tl.float32))
    x = tl.load(x_ptr + row * stride_xt + h * stride_xh + offs_p * stride_xp, mask=p_ok, other=0.0)
    x = x.to(tl.float32)
    b = tl.load(b_ptr + row * stride_bt + g * stride_bg + offs_n * stride_bn, mask=n_ok, other=0.0)
    c = tl.load(c_ptr + row * stride_ct + g * stride_cg + offs_n * stride_cn, mask=n_ok, other=0.0)
    s_ptrs = state_ptr + slot * stride_sn + h * stride_sh
    s_ptrs += offs_p[:, None] * stride_sp + offs_n[None, :] * stride_sk
    s = tl.load(s_ptrs, mask=m, other=0.0).to(tl.float32)
    s = s * decay + (x * dt)[:, None] * b.to(tl.float32)[None, :]
    tl.store(s_ptrs, s.to(state_ptr.dtype.element_ty), mask=m)
    y = tl.sum(s * c.to(tl.float32)[None, :], axis=1)
    if HAS_D:
        y += x * tl.load(d_ptr + h).to(tl.float32)
    tl.store(y_ptr + row * H * P + h * P + offs_p, y.to(y_ptr.dtype.element_ty), mask=p_ok)


def ssd_decode(
    ssm_state: torch.Tensor,  # [slots, H, P, N] updated in place at ``slots``
    x: torch.Tensor,  # [T, H, P]
    dt: torch.Tensor,  # [T, H] after mamba_dt
    A: torch.Tensor,  # [H]
    B: torch.Tensor,  # [T, G, N]
    C: torch.Tensor,  # [T, G, N]
    D: torch.Tensor | None,  # [H]
    rows: torch.Tensor,  # int64 [n] the decode rows of the batch
    slots: torch.Tensor,  # int64 [n] their state slots
    y: torch.Tensor,  # [T, H, P] contiguous: rows ``rows`` are written
) -> None:
    """state_reference.ssd_update for the batch's decode rows in one launch, each against its
    slot of the pool directly (no gather and scatter of the states)."""
    T, H, P = x.shape
    G, N = B.shape[1], B.shape[2]
    if tuple(ssm_state.shape[1:]) != (H, P, N) or H % G or tuple(C.shape) != tuple(B.shape):
        raise ValueError(
            f"ssm_state must be [slots, {H}, {P}, {N}] (x [T, H, P], B and C [T, G, N] with H "
            f"a multiple of G), got ssm_state {tuple(ssm_state.shape)}, B {tuple(B.shape)}, "
            f"C {tuple(C.shape)}"
        )
    if not y.is_contiguous() or y.shape != x.shape:
        raise ValueError(f"y must be contiguous {tuple(x.shape)}, got {tuple(y.shape)}")
    n = rows.shape[0]
    if n == 0:
        return
    block_p = min(_SSD_BLOCK_P, triton.next_power_of_2(P))
    _ssd_decode_kernel[(n, H, triton.cdiv(P, block_p))](
        ssm_state,
        x,
        dt,
        A,
        B,
        C,
        D if D is not None else A,
        y,
        rows,
        slots,
        *ssm_state.stride(),
        *x.stride(),
        *dt.stride(),
        *B.stride(),
        *C.stride(),
        H,
        P,
        N,
        HEADS_PER_GROUP=H // G,
        HAS_D=D is not None,
        BLOCK_P=block_p,
        BLOCK_N=triton.next_power_of_2(N),
        num_warps=4,
    )


def ssd_varlen(
    x: torch.Tensor,  # [T, H, P]
    dt: torch.Tensor,  # [T, H] after mamba_dt
    A: torch.Tensor,  # [H]
    B: torch.Tensor,  # [T, G, N]
    C: torch.Tensor,  # [T, G, N]
    D: torch.Tensor | None,  # [H]
    chunk_size: int,
    meta: StateMetadata,
    ssm_state: torch.Tensor,  # [slots, H, P, N]
) -> torch.Tensor:  # [T, H, P]
    """state_layers.ssd_varlen: the decode rows in one Triton launch, each prefill span through
    the reference's chunked scan (the module docstring says why)."""
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if meta.num_decode:
        ssd_decode(ssm_state, x, dt, A, B, C, D, meta.decode_rows, meta.decode_slots, y)
    ssd_prefills(x, dt, A, B, C, D, chunk_size, meta.prefills, ssm_state, y)  # saves too
    return y
