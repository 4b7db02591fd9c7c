"""The state pool (radixray/worker/state_pool.py): slot ids exact as plain ints (the page
allocator's contract), per-layer state views of the right shapes, and ``copy`` giving a fork its
own state that no later write to either side changes."""

from __future__ import annotations

import pytest
import torch

from radixray.model_meta.model_config import ModelConfig
from radixray.model_meta.state_layers import Mamba2Spec, ShortConvSpec
from radixray.worker.state_pool import StatePool

BASE = {
    "vocab_size": 100,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 8,
}
LFM2 = ModelConfig(
    **BASE,
    num_layers=3,
    architecture="lfm2",
    layer_kinds=("conv", "attention", "conv"),
    short_conv=ShortConvSpec(kernel=3),
)
GRANITE = ModelConfig(
    **BASE,
    num_layers=4,
    architecture="granitemoehybrid",
    layer_kinds=("mamba", "mamba", "attention", "mamba"),
    mamba=Mamba2Spec(num_heads=4, head_dim=16, state_size=8, n_groups=2, conv_kernel=4),
)


def test_slots_are_handed_out_and_returned_as_exact_ints():
    pool = StatePool(LFM2, 4)
    assert (pool.num_slots, pool.num_free, pool.occupancy) == (4, 4, 0.0)
    assert pool.alloc(3) == [0, 1, 2]
    assert pool.alloc(2) is None  # short: nothing taken
    assert (pool.num_free, pool.occupancy) == (1, 0.75)
    pool.free([1])
    assert pool.alloc(2) == [1, 3]
    with pytest.raises(ValueError, match="freed twice"):
        pool.free([2, 2])
    pool.free([2])
    with pytest.raises(ValueError, match="already free"):
        pool.free([2])
    with pytest.raises(ValueError, match="out of range"):
        pool.free([4])
    pool.check_integrity()
    assert pool.num_used == 3


def test_state_views_have_each_layers_shape():
    lfm2 = StatePool(LFM2, 5)
    assert tuple(lfm2.conv_state(0).shape) == tuple(lfm2.conv_state(2).shape) == (5, 32, 2)
    with pytest.raises(ValueError, match="conv layer: it has no SSM state"):
        lfm2.ssm_state(0)
    with pytest.raises(ValueError, match=r"layer 1 has no state \(state layers: \[0, 2\]\)"):
        lfm2.conv_state(1)
    assert lfm2.bytes_per_slot == 2 * 32 * 2 * 4
    granite = StatePool(GRANITE, 3, dtype=torch.float16)
    conv_dim = 64 + 2 * 2 * 8
    assert tuple(granite.conv_state(3).shape) == (3, conv_dim, 3)
    assert tuple(granite.ssm_state(1).shape) == (3, 4, 16, 8)
    assert granite.conv_state(0).dtype == torch.float16
    assert granite.ssm_state(0).dtype == torch.float32  # accumulates: float32 by default
    assert granite.bytes_per_slot == 3 * (conv_dim * 3 * 2 + 4 * 16 * 8 * 4)
    with pytest.raises(ValueError, match="no state"):
        StatePool(ModelConfig(**BASE, num_layers=1), 2)


def fill(pool: StatePool, slot: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for t in pool.tensors.values():
        t[:, slot] = torch.randn(t[:, slot].shape, generator=g).to(t.dtype)


def slot_state(pool: StatePool, slot: int) -> list[torch.Tensor]:
    return [t[:, slot].clone() for t in pool.tensors.values()]


@pytest.mark.parametrize("config", [LFM2, GRANITE], ids=["lfm2", "granite"])
def test_a_copy_is_exact_and_then_independent(config):
    pool = StatePool(config, 4)
    src, dst, other = pool.alloc(3)
    fill(pool, src, 1)
    fill(pool, dst, 2)
    fill(pool, other, 3)
    before_other = slot_state(pool, other)
    pool.copy(src, dst)
    original = slot_state(pool, src)
    assert all(torch.equal(a, b) for a, b in zip(slot_state(pool, dst), original, strict=True))
    fill(pool, dst, 4)  # the fork moves on: its source does not
    assert all(torch.equal(a, b) for a, b in zip(slot_state(pool, src), original, strict=True))
    copied = slot_state(pool, dst)
    fill(pool, src, 5)  # and the other way round
    assert all(torch.equal(a, b) for a, b in zip(slot_state(pool, dst), copied, strict=True))
    assert all(
        torch.equal(a, b) for a, b in zip(slot_state(pool, other), before_other, strict=True)
    )
    # in the per-layer views the model writes through, too
    layer = config.state_layers[0]
    pool.conv_state(layer)[src].fill_(7.0)
    assert not torch.equal(pool.conv_state(layer)[dst], pool.conv_state(layer)[src])


def test_copy_needs_two_allocated_slots():
    pool = StatePool(GRANITE, 3)
    a, _ = pool.alloc(2)
    with pytest.raises(ValueError, match="slot 2 is free"):
        pool.copy(a, 2)
    with pytest.raises(ValueError, match="out of range"):
        pool.copy(a, 3)
    pool.copy(a, a)  # a no-op
