"""Policies over a fleet with host tiers: the fixed-discount baselines (kv_cost's host-block
weight, Dynamo's 0.75 and llm-d's 0.8) and tier-blind routing (weight 0)."""

from __future__ import annotations

import pytest

from radixray.router.policies import make_policy

from .test_policies import P, index_with, req, ws


def _tiered_index():
    """Worker 0: the request's first 2 blocks on its device, the next 4 on its host tier;
    worker 1: the first 4 on its device."""
    idx = index_with(w0=2, w1=4)
    idx.insert(0, list(range(1002, 1006)), tier="host")
    return idx


def test_kv_cost_weighs_host_blocks_at_its_discount():
    idx = _tiered_index()
    workers = [ws(0), ws(1)]
    # overlap: w0 = 2 + 0.75 * 4 = 5 blocks, w1 = 4 -> prefill 3 vs 4 blocks
    d = make_policy("kv_cost").choose(req(8), workers, idx)
    assert d.scores == {0: 3 + 8.0, 1: 4 + 8.0} and d.worker_id == 0
    assert d.predicted_cached_tokens == 2 * P  # the device hit; the rest is loaded
    d = make_policy("kv_cost", host_block_weight=0.8).choose(req(8), workers, idx)
    assert d.scores[0] == pytest.approx(8 - 2 - 3.2 + 8)
    blind = make_policy("kv_cost", host_block_weight=0.0).choose(req(8), workers, idx)
    assert blind.worker_id == 1 and blind.scores == {0: 6 + 8.0, 1: 4 + 8.0}


def test_host_weight_is_checked():
    with pytest.raises(ValueError, match="host_block_weight must be in"):
        make_policy("kv_cost", host_block_weight=1.5)
