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


def test_host_slots_take_and_give_back_every_layers_state_in_order():
    """``add_host``: host slots of every tensor; the cache's copies (``PageCopy(state=True)``)
    run in their order, and a step's restore from a host slot (``StateCopy(host=True)``)
    writes the device slot; host and device slot ids are separate ints."""
    from radixray.cache_index.host_tier import PageCopy
    from radixray.worker.state_checkpointer import StateCopy
    from radixray.worker.state_pool import default_host_state_slots

    pool = StatePool(GRANITE, 3)
    alloc = pool.add_host(2)
    assert alloc.num_pages == 2 and set(pool.host) == set(pool.tensors)
    for t in pool.tensors.values():
        t.copy_(torch.randn(t.shape))
    before = {k: t.clone() for k, t in pool.tensors.items()}
    # slots 1, 2 -> host 1, 0; then slot 1 -> host 0 again (reused): the last copy wins
    moved = pool.host_copies([PageCopy(True, [1, 2], [1, 0], state=True),
                              PageCopy(True, [1], [0], state=True)])  # fmt: skip
    assert moved == 3 * pool.bytes_per_slot
    for k, h in pool.host.items():
        assert torch.equal(h[:, 0], before[k][:, 1]) and torch.equal(h[:, 1], before[k][:, 1])
    pool.tensors["mamba_ssm"][:, 1] = float("nan")  # the device slot is reused meanwhile
    pool.run_copies([StateCopy(1, 0, None, 4, False, host=True)])  # host 1 -> device 0
    pool.host_copies([PageCopy(False, [0], [2], state=True)])  # host 0 -> device 2
    for k, t in pool.tensors.items():
        assert torch.equal(t[:, 0], before[k][:, 1]) and torch.equal(t[:, 2], before[k][:, 1])
    assert default_host_state_slots(64, 16, 8) == 32  # the device's ratio of slots to pages
    assert default_host_state_slots(1, 16, 8) == 2  # at least 2
    assert default_host_state_slots(64, 16, 8, budget=10 * 100, slot=100) == 10  # capped
    with pytest.raises(ValueError, match="host_slots must be >= 1"):
        StatePool(LFM2, 2).add_host(0)
