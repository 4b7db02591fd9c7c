"""The in-place decode updates (radixray/kernels/state_cpu.py) against the references'
gather-update-scatter (state_reference.py): the same outputs and the same states at the batch's
slots, every other slot untouched (exactly), for slots in one run, out of order, fragmented and
single.

Tolerance 1e-5 (float32): the state update is the reference's arithmetic (one product and one
sum per element, possibly fused), ``y`` the same sum over the state size in another order.
"""

from __future__ import annotations

import pytest
import torch

from radixray.kernels.state_cpu import (
    SlotRun,
    conv_update_slots,
    slot_runs,
    ssd_update_slots,
)
from radixray.kernels.state_reference import causal_conv1d_update, ssd_update

TOL = {"rtol": 1e-5, "atol": 1e-5}
SLOTS = {
    "one_run": [2, 3, 4, 5],
    "out_of_order": [5, 0, 1, 7, 3],
    "single": [6],
    "every_other": [0, 2, 4, 6],
}
NUM_SLOTS = 8


def test_slot_runs_cut_at_every_break_in_consecutive_ids():
    assert slot_runs([]) == ()
    assert slot_runs([4]) == (SlotRun(0, 4, 1),)
    assert slot_runs([2, 3, 4, 0, 1, 7, 6]) == (
        SlotRun(0, 2, 3),
        SlotRun(3, 0, 2),
        SlotRun(5, 7, 1),
        SlotRun(6, 6, 1),
    )


def _reference(update, pool: torch.Tensor, slots: list[int], *args):
    """The reference on a gathered copy, scattered back: (output, the pool after)."""
    pool = pool.clone()
    idx = torch.tensor(slots)
    state = pool.index_select(0, idx)
    out = update(state, *args)
    pool.index_copy_(0, idx, state)
    return out, pool


@pytest.mark.parametrize("slots", list(SLOTS))
@pytest.mark.parametrize("silu,with_bias", [(False, False), (True, True)])
def test_conv_update_on_the_pools_slots_equals_the_reference(slots, silu, with_bias):
    g = torch.Generator().manual_seed(1)
    ids, C, K = SLOTS[slots], 6, 4
    pool = torch.randn(NUM_SLOTS, C, K - 1, generator=g)
    x, w = torch.randn(len(ids), C, generator=g), torch.randn(C, K, generator=g)
    b = torch.randn(C, generator=g) if with_bias else None
    want, want_pool = _reference(lambda s, *a: causal_conv1d_update(x, w, b, s, silu), pool, ids)
    got = conv_update_slots(x, w, b, pool, slot_runs(ids), silu)
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(pool, want_pool, **TOL)
    others = [s for s in range(NUM_SLOTS) if s not in ids]
    assert torch.equal(pool[others], want_pool[others])


@pytest.mark.parametrize("slots", list(SLOTS))
@pytest.mark.parametrize("groups,with_d", [(1, True), (2, False)])
def test_ssd_update_on_the_pools_slots_equals_the_reference(slots, groups, with_d):
    g = torch.Generator().manual_seed(2)
    ids, H, P, N = SLOTS[slots], 4, 8, 16
    n = len(ids)
    pool = torch.randn(NUM_SLOTS, H, P, N, generator=g)
    x = torch.randn(n, H, P, generator=g)
    dt = torch.rand(n, H, generator=g)
    A = -torch.rand(H, generator=g)
    B, C = torch.randn(2, n, groups, N, generator=g)
    D = torch.randn(H, generator=g) if with_d else None
    want, want_pool = _reference(lambda s: ssd_update(s, x, dt, A, B, C, D), pool, ids)
    before = pool.clone()
    got = ssd_update_slots(pool, slot_runs(ids), x, dt, A, B, C, D)
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(pool, want_pool, **TOL)
    others = [s for s in range(NUM_SLOTS) if s not in ids]
    assert torch.equal(pool[others], before[others])


def test_ssd_update_refuses_a_pool_it_cannot_update_in_place():
    pool = torch.zeros(2, 1, 2, 3, dtype=torch.float64)
    x, dt = torch.zeros(1, 1, 2), torch.zeros(1, 1)
    with pytest.raises(ValueError, match="contiguous float32"):
        ssd_update_slots(pool, slot_runs([0]), x, dt, dt[0], x[:, :, :1], x[:, :, :1], None)
