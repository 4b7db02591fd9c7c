"""The simulator's host-tier options: copies overlapped layer by layer with the forward
(``TimingModel.overlap_layers``) and write-through after N hits (``host_write_through_hits``)."""

from __future__ import annotations

import pytest

from radixray.sim import SimConfig, multiturn_chat, simulate
from radixray.sim.sim_worker import SimWorker
from radixray.sim.timing import TimingModel, timing_preset
from radixray.sim.workload import SimRequest, Workload

P = 4
TIMING = TimingModel(0.01, 0.001, 0.0, 0.001, 0.0, 64, 4, kv_bytes_per_token=1000,
                     load_bytes_per_s=1e6, load_overhead_s=0.002)  # fmt: skip


def test_overlapped_copies_expose_one_layer_or_what_outlasts_the_forward():
    t = TIMING.with_(overlap_layers=4)
    assert TIMING.with_copies(1.0, 0.4) == 1.4  # one after the other: the engine today
    assert t.with_copies(1.0, 0.4) == pytest.approx(1.1)  # the first layer's copy waits
    assert t.with_copies(0.1, 2.0) == 2.0  # the copies outlast the forward
    assert t.with_copies(1.0, 0.0) == 1.0
    with pytest.raises(ValueError, match="overlap_layers"):
        TIMING.with_(overlap_layers=-1)


def _serve(worker: SimWorker, wl: Workload) -> list[SimWorker]:
    """Serve each request to completion in turn; the pages copied to host after each."""
    now, out = 0.0, []
    for k, req in enumerate(wl.requests):
        dt = worker.enqueue(req, wl.block_hashes(P)[k], now)
        while dt is not None:
            now += dt
            dt = worker.step_end(now)
        out.append(worker.pages_to_host)
    return out


def test_write_through_copies_a_hit_prefix_once_and_its_demotion_copies_nothing():
    # A (24 tokens); A again with 4 more (a hit); B, distinct, pushes A off 8 device pages
    reqs = [
        SimRequest(0, 0.0, ((1, 24),), 1),
        SimRequest(1, 1.0, ((1, 24), (3, 4)), 1),
        SimRequest(2, 2.0, ((2, 24),), 1),
    ]
    wl = Workload("three", reqs, 0)
    back = _serve(SimWorker(0, 8, P, TIMING, wl, host_pages=32), wl)
    through = _serve(SimWorker(0, 8, P, TIMING, wl, host_pages=32, host_write_through_hits=1), wl)
    assert back[:2] == [0, 0] and back[2] > 0  # write-back: copied when B evicts it
    # write-through: A's 6 pages are copied when the hit locks them; B's evictions then copy
    # A's pages no more (what B pushes off and was never hit is copied as before)
    assert through[1] == 6
    assert through[2] == back[2]


def test_a_simulated_cluster_with_write_through_and_overlap_runs_and_copies_less_at_demotion():
    wl = multiturn_chat(num_requests=120, seed=2)
    t = timing_preset("cpu", overlap_layers=30)
    runs = {}
    for wt in (None, 1):
        cfg = SimConfig(num_workers=2, num_pages=24, host_pages=72, page_size=16, timing=t,
                        host_write_through_hits=wt, check_every=50)  # fmt: skip
        runs[wt] = simulate(wl, "ttft", cfg)
    assert runs[1].host_copies["pages_to_host"] != runs[None].host_copies["pages_to_host"]
    assert all(r.records[-1].cached >= 0 for r in runs.values())
