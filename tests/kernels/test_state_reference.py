"""The state layers' reference kernels (radixray/kernels/state_reference.py) against their
definitions: the conv against torch's zero-padded conv1d, the chunked SSD scan against the
one-step recurrence, each split anywhere with its state carried over equal to one pass, and
the scan against transformers' own torch implementation (an independent one).

Tolerances: float32 throughout; 1e-5 where the same sums are formed in another order (the
chunked scan against the recurrence sums up to a few dozen terms of O(1)).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from radixray.kernels.state_reference import (
    causal_conv1d,
    causal_conv1d_update,
    conv_state_at,
    mamba_dt,
    ssd_recurrent,
    ssd_scan,
    ssd_scan_cut,
    ssd_update,
)

TOL = {"rtol": 1e-5, "atol": 1e-5}


def conv_inputs(L: int, C: int = 6, K: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(L, C, generator=g),
        torch.randn(C, K, generator=g),
        torch.randn(C, generator=g),
    )


@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_conv_from_zero_state_is_a_zero_padded_causal_conv(silu, with_bias):
    x, w, b = conv_inputs(13)
    b = b if with_bias else None
    out, state = causal_conv1d(x, w, b, None, silu)
    K = w.shape[1]
    expected = F.conv1d(x.T[None], w[:, None], b, padding=K - 1, groups=x.shape[1])[0, :, :13].T
    if silu:
        expected = F.silu(expected)
    torch.testing.assert_close(out, expected, **TOL)
    assert torch.equal(state, x[-(K - 1) :].T)  # the last K-1 inputs, oldest first


@pytest.mark.parametrize("K", [2, 3, 4])
def test_conv_split_anywhere_equals_one_pass_and_decode_steps_continue_it(K):
    x, w, b = conv_inputs(11, K=K)
    whole, final = causal_conv1d(x, w, b, None, True)
    for cut in (1, K - 1, 5, 10):  # chunks shorter than the state too
        first, state = causal_conv1d(x[:cut], w, b, None, True)
        rest, state = causal_conv1d(x[cut:], w, b, state, True)
        torch.testing.assert_close(torch.cat((first, rest)), whole, **TOL)
        assert torch.equal(state, final)
    # decode: a batch of two sequences, one token per step, each from its own state
    _, s = causal_conv1d(x[:6], w, b, None, True)
    states = torch.stack((s, torch.zeros_like(s)))
    for t in range(6, 11):
        out = causal_conv1d_update(torch.stack((x[t], x[t - 6])), w, b, states, True)
        torch.testing.assert_close(out[0], whole[t], **TOL)
        torch.testing.assert_close(out[1], whole[t - 6], **TOL)
    assert torch.equal(states[0], final)


@pytest.mark.parametrize("K", [2, 3, 4])
@pytest.mark.parametrize("initial", [False, True])
def test_conv_state_at_any_offset_is_the_state_after_that_many_rows(K, initial):
    """An in-forward save's conv state: at every offset, near the start (part of it the
    initial state, or zeros for a fresh sequence) and past ``K - 1``, exactly the state
    ``causal_conv1d`` leaves after those rows."""
    x, w, b = conv_inputs(7, K=K)
    state = torch.randn(x.shape[1], K - 1) if initial else None
    assert torch.equal(conv_state_at(x, state, 0, K), state if initial else torch.zeros(6, K - 1))
    for offset in range(1, 8):
        _, want = causal_conv1d(x[:offset], w, b, state)
        assert torch.equal(conv_state_at(x, state, offset, K), want), offset
    with pytest.raises(ValueError, match=r"offset must be in \[0, 7\]"):
        conv_state_at(x, state, 8, K)


def test_scan_cut_at_points_gives_each_points_state_and_refuses_cuts_outside():
    x, dt, A, B, C, D, _ = ssd_inputs(11)
    y, states = ssd_scan_cut(x, dt, A, B, C, D, 4, None, [3, 8])
    _, at3 = ssd_scan(x[:3], dt[:3], A, B[:3], C[:3], D, 4)
    _, at8 = ssd_scan(x[3:8], dt[3:8], A, B[3:8], C[3:8], D, 4, at3)
    rest, final = ssd_scan(x[8:], dt[8:], A, B[8:], C[8:], D, 4, at8)
    assert len(states) == 3 and torch.equal(states[1], at8) and torch.equal(states[2], final)
    assert torch.equal(y[8:], rest)
    for cuts in ([0], [11], [5, 5], [6, 2]):
        with pytest.raises(ValueError, match="cuts must increase strictly"):
            ssd_scan_cut(x, dt, A, B, C, D, 4, None, cuts)


def ssd_inputs(L: int, H: int = 6, P: int = 4, G: int = 2, N: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(L, H, P, generator=g)
    dt = mamba_dt(torch.randn(L, H, generator=g), torch.randn(H, generator=g))
    A = -torch.rand(H, generator=g) * 3.0
    B, C = torch.randn(L, G, N, generator=g), torch.randn(L, G, N, generator=g)
    D = torch.randn(H, generator=g)
    state = torch.randn(H, P, N, generator=g)
    return x, dt, A, B, C, D, state


@pytest.mark.parametrize("chunk", [1, 3, 8, 64])
@pytest.mark.parametrize("G", [1, 2, 6])
@pytest.mark.parametrize("initial", [False, True])
def test_chunked_scan_equals_the_recurrence(chunk, G, initial):
    x, dt, A, B, C, D, state = ssd_inputs(37, G=G)
    state = state if initial else None
    y, final = ssd_scan(x, dt, A, B, C, D, chunk, state)
    y_ref, final_ref = ssd_recurrent(x, dt, A, B, C, D, state)
    torch.testing.assert_close(y, y_ref, **TOL)
    torch.testing.assert_close(final, final_ref, **TOL)


def test_scan_split_anywhere_with_its_state_equals_one_pass():
    x, dt, A, B, C, D, _ = ssd_inputs(29)
    whole, final = ssd_scan(x, dt, A, B, C, D, 8)
    for cut in (1, 7, 8, 9, 28):
        first, s = ssd_scan(x[:cut], dt[:cut], A, B[:cut], C[:cut], D, 8)
        rest, s = ssd_scan(x[cut:], dt[cut:], A, B[cut:], C[cut:], D, 8, s)
        torch.testing.assert_close(torch.cat((first, rest)), whole, **TOL)
        torch.testing.assert_close(s, final, **TOL)


def test_scan_split_at_a_multiple_of_its_chunk_is_bitwise_one_pass():
    # what a resumed prefill relies on to equal a cold one exactly: cut where the scan's own
    # chunks end, the same chunks are computed from the same values (elsewhere: rounding)
    x, dt, A, B, C, D, _ = ssd_inputs(40)
    whole, final = ssd_scan(x, dt, A, B, C, D, 8)
    for cut in (8, 16, 32):
        first, s = ssd_scan(x[:cut], dt[:cut], A, B[:cut], C[:cut], D, 8)
        rest, s = ssd_scan(x[cut:], dt[cut:], A, B[cut:], C[cut:], D, 8, s)
        assert torch.equal(torch.cat((first, rest)), whole) and torch.equal(s, final)


def test_decode_update_continues_a_scan_in_place():
    x, dt, A, B, C, D, s0 = ssd_inputs(12)
    whole, _ = ssd_scan(x, dt, A, B, C, D, 4, s0)
    _, s = ssd_scan(x[:10], dt[:10], A, B[:10], C[:10], D, 4, s0)
    batch = torch.stack((s, s0))  # two sequences: one 10 tokens in, one fresh from s0
    for t in (10, 11):
        y = ssd_update(
            batch,
            torch.stack((x[t], x[t - 10])),
            torch.stack((dt[t], dt[t - 10])),
            A,
            torch.stack((B[t], B[t - 10])),
            torch.stack((C[t], C[t - 10])),
            D,
        )
        torch.testing.assert_close(y[0], whole[t], **TOL)
        torch.testing.assert_close(y[1], whole[t - 10], **TOL)


def test_dt_is_softplus_of_dt_plus_bias_clamped_to_the_limits():
    raw, bias = torch.tensor([[-30.0, 0.0, 3.0]]), torch.tensor([0.0, 0.5, 1.0])
    torch.testing.assert_close(mamba_dt(raw, bias), F.softplus(raw + bias))
    expected = torch.tensor([[0.1, math.log1p(math.exp(0.5)), 1.0]])
    torch.testing.assert_close(mamba_dt(raw, bias, 0.1, 1.0), expected)


def test_scan_matches_transformers_torch_implementation():
    from transformers.models.granitemoehybrid.modeling_granitemoehybrid import mamba2_chunk_scan

    g = torch.Generator().manual_seed(5)
    x, _, A, B, C, D, s0 = ssd_inputs(37)
    raw, bias = torch.randn(37, 6, generator=g), torch.randn(6, generator=g)
    y, final = ssd_scan(x, mamba_dt(raw, bias, 0.0, 2.0), A, B, C, D, 8, s0)
    y_hf, final_hf = mamba2_chunk_scan(
        x[None],
        raw[None],
        A,
        B[None],
        C[None],
        chunk_size=16,
        D=D,
        dt_bias=bias,
        initial_states=s0[None],
        dt_softplus=True,
        dt_limit=(0.0, 2.0),
        return_final_states=True,
    )
    torch.testing.assert_close(y, y_hf[0], **TOL)
    torch.testing.assert_close(final, final_hf[0], **TOL)
