"""The simulator's host-tier options: copies overlapped layer by layer with the forward
(``TimingModel.overlap_layers``) and write-through after N hits (``host_write_through_hits``)."""

from __future__ import annotations

import math

import pytest

from radixray.sim import SimConfig, multiturn_chat, simulate
from radixray.sim.sim_cli import build_parser
from radixray.sim.sim_cli import main as sim_main
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
    assert t.with_copies(0.1, 2.0) == pytest.approx(2.025)  # the copies, then a last layer
    assert t.with_copies(1.0, 0.0) == 1.0
    with pytest.raises(ValueError, match="overlap_layers"):
        TIMING.with_(overlap_layers=-1)


def test_each_preset_prices_copies_as_its_device_runs_them():
    # gpu: an 8B model's 32 layers, copies on their own stream; cpu: copies, then forward
    gpu, cpu = timing_preset("gpu"), timing_preset("cpu")
    assert gpu.overlap_layers == 32 and cpu.overlap_layers == 0
    assert gpu.with_copies(0.32, 0.064) == pytest.approx(0.064 / 32 + 0.32)
    assert cpu.with_copies(0.32, 0.064) == pytest.approx(0.384)
    # in series on request: 0 and 1 layer are the same sum
    for serial in (0, 1):
        assert timing_preset("gpu", overlap_layers=serial).with_copies(0.32, 0.064) == (
            pytest.approx(0.384)
        )


def test_sim_overlap_layers_flag_overrides_the_preset_and_refuses_a_bad_value(capsys):
    assert build_parser().parse_args([]).overlap_layers is None  # the timing model's own
    assert build_parser().parse_args(["--overlap-layers", "0"]).overlap_layers == 0
    with pytest.raises(SystemExit):
        sim_main(["--overlap-layers", "-1"])
    assert "--overlap-layers: must be an int >= 0" in capsys.readouterr().err


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
    # each record's TTFT breakdown: before its first step, forwards, copies, between steps
    served = [r for r in runs[None].records if not math.isnan(r.forward_s)]
    assert len(served) == len(wl.requests) - runs[None].oversize  # refused: no steps
    for rec in served:
        assert rec.wait_s >= 0 and rec.forward_s > 0 and rec.copy_s >= 0
        assert rec.wait_s + rec.forward_s + rec.copy_s <= rec.ttft + 1e-9
    assert sum(rec.copy_s for rec in served) > 0


def test_a_lone_request_s_ttft_is_its_forwards_and_copies():
    wl = Workload("one", [SimRequest(0, 0.5, ((1, 200),), 2)], 0)
    cfg = SimConfig(num_workers=1, num_pages=64, page_size=P, timing=TIMING)
    (rec,) = simulate(wl, "round_robin", cfg).records
    assert rec.wait_s == 0 and rec.copy_s == 0
    assert rec.forward_s == pytest.approx(rec.ttft)  # 200 tokens: four chunks of 64, back to back
