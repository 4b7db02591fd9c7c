"""Reuse telemetry in the simulator: available (the longest prefix any worker held, by the
router's index), captured (what the chosen worker held, by the index) and delivered (what it
reused)."""

from __future__ import annotations

import pytest

from radixray.sim import SimConfig, load_mooncake, simulate
from tests.sim.test_bound import traces  # noqa: F401 - the fixture
from tests.sim.test_simulator import BT


@pytest.mark.parametrize("policy", ["round_robin", "cache_aware", "ttft"])
def test_captured_never_exceeds_available_and_round_robin_leaves_reuse_behind(traces, policy):  # noqa: F811
    wl = load_mooncake(traces[0], block_tokens=BT, speedup=8.0)
    result = simulate(wl, policy, SimConfig(num_workers=3, num_pages=256, page_size=BT))
    for r in result.records:
        assert 0 <= r.captured <= r.available <= (r.prompt_tokens - 1) // BT * BT
    s = result.summary()
    assert s["reuse_captured"] <= s["reuse_available"]
    if policy == "round_robin":  # blind to the cache: most of what was available is left
        assert s["reuse_captured"] < 0.6 * s["reuse_available"]


def test_an_exact_index_predicts_exactly_and_a_stale_one_overpredicts(traces):  # noqa: F811
    wl = load_mooncake(traces[1], block_tokens=BT)  # one request at a time
    exact = simulate(
        wl, "ttft", SimConfig(num_workers=1, num_pages=8192, page_size=BT, event_delay_s=0.0)
    )
    assert all(r.captured == r.cached == r.available for r in exact.records)
    s = exact.summary()
    assert s["reuse_over"] == 0 and s["reuse_under"] == 0
    # A cache far too small for the trace and KV events that never arrive: the index keeps
    # pages the worker has long evicted, so it promises reuse that is not there.
    wl = load_mooncake(traces[0], block_tokens=BT, speedup=8.0)
    stale = simulate(
        wl, "cache_aware", SimConfig(num_workers=2, num_pages=24, page_size=BT, event_delay_s=None)
    )
    s = stale.summary()
    assert s["reuse_over"] > 0
    over = sum(max(r.captured - r.cached, 0) for r in stale.records)
    assert s["reuse_over"] == pytest.approx(over / sum(r.prompt_tokens for r in stale.records))
