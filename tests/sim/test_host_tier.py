"""Host tiers in the simulator: a simulated worker demotes and loads back as the engine does and
charges the copies' time; the pooled-cache reference counts host capacity; ttft in the simulator
prices a host-tier holder's load against a recompute elsewhere."""

from __future__ import annotations

import json

import pytest

from radixray.cache_index import ApproxIndex
from radixray.router.policies import RoutingRequest, make_policy
from radixray.sim import SimConfig, multiturn_chat, simulate
from radixray.sim.results import pooled_hits
from radixray.sim.sim_cli import main as sim_main
from radixray.sim.sim_worker import SimWorker
from radixray.sim.timing import TimingModel, load_timing, timing_preset
from radixray.sim.workload import SimRequest, Workload

P = 4
TIMING = TimingModel(0.01, 0.001, 0.0, 0.001, 0.0, 64, 4, kv_bytes_per_token=1000,
                     load_bytes_per_s=1e6, load_overhead_s=0.002)  # fmt: skip


def _workload() -> Workload:
    """A (24 tokens), B (a distinct 24) that pushes A off an 8-page device pool, then C: A's
    prompt and 4 more tokens."""
    reqs = [
        SimRequest(0, 0.0, ((1, 24),), 1),
        SimRequest(1, 1.0, ((2, 24),), 1),
        SimRequest(2, 2.0, ((1, 24), (3, 4)), 1),
    ]
    return Workload("three", reqs, 0)


def _run(worker: SimWorker, wl: Workload, upto: int) -> tuple[float | None, float]:
    """Serve requests before ``upto`` to completion, then enqueue request ``upto``; its first
    step's duration and the time."""
    now = 0.0
    for k, req in enumerate(wl.requests[: upto + 1]):
        dt = worker.enqueue(req, wl.block_hashes(P)[k], now)
        if k == upto:
            return dt, now
        while dt is not None:
            now += dt
            dt = worker.step_end(now)
    raise AssertionError("unreachable")


def test_a_sim_worker_loads_a_demoted_prefix_back_and_charges_its_copies():
    wl = _workload()
    w = SimWorker(0, 8, P, TIMING, wl, host_pages=32)
    dt, _ = _run(w, wl, 2)
    (item,) = w.batch.items
    # A's six full pages were demoted by B, and come back for C: miss cause host, not evicted
    assert item.req.miss["host"] == 24 and item.req.miss["evicted"] == 0
    assert item.req.cached_tokens == 24
    assert w.pages_from_host == 6
    # the step: C's 4 new tokens, plus every page copied since the last step (C's load-back
    # and the demotion of B's pages it evicted), priced at overhead + bytes / rate
    pages = w.pages_from_host + w.pages_to_host - 6  # A's demotion was an earlier step's
    copy = 0.002 + pages * P * 1000 / 1e6
    assert dt == pytest.approx(TIMING.step_time(*w.batch.shape()) + copy)
    assert w.copy_seconds == pytest.approx(2 * 0.002 + (w.pages_from_host + w.pages_to_host) * P
                                           * 1000 / 1e6)  # fmt: skip
    w.check_integrity()
    # an engine that overlaps its write-back: only the load is charged
    free = SimWorker(0, 8, P, TIMING.with_(charge_demotions=False), wl, host_pages=32)
    dt_free, _ = _run(free, wl, 2)
    assert dt_free == pytest.approx(TIMING.step_time(*free.batch.shape()) + 0.002 + 0.024)
    # the router sees its load-back as the worker pool would report it, in prompt tokens
    s = w.state()
    assert s.load_tokens_per_s == pytest.approx(1e6 / 1000) and s.load_overhead_s == (
        pytest.approx(0.002)
    )
    # without a host tier the same prefix is gone: recomputed, and no load rate reported
    bare = SimWorker(0, 8, P, TIMING, wl)
    _run(bare, wl, 2)
    (item,) = bare.batch.items
    assert item.req.miss["evicted"] == 24 and item.req.cached_tokens == 0
    assert bare.state().load_tokens_per_s == 0


def test_the_pooled_reference_counts_host_capacity():
    wl = multiturn_chat(num_requests=150, seed=1)
    cfg = SimConfig(num_workers=2, num_pages=24, host_pages=72, page_size=16,
                    timing=timing_preset("cpu"))  # fmt: skip
    r = simulate(wl, "ttft", cfg)
    assert r.pooled_tokens == sum(pooled_hits(wl, 16, 2 * (24 + 72)))
    assert r.pooled_tokens > sum(pooled_hits(wl, 16, 2 * 24))
    assert r.host_copies["pages_from_host"] > 0 and r.host_copies["copy_seconds"] > 0


def test_a_host_tier_needs_a_priced_copy_and_a_valid_flag(capsys, tmp_path):
    no_rate = TIMING.with_(load_bytes_per_s=0.0)
    with pytest.raises(ValueError, match="load_bytes_per_s"):
        SimConfig(num_pages=8, host_pages=8, timing=no_rate)
    assert SimConfig(num_pages=8, host_pages=0, timing=no_rate).host_pages == 0
    with pytest.raises(SystemExit):
        sim_main(["--host-pages", "-1"])
    assert "--host-pages: must be an int >= 0" in capsys.readouterr().err
    # a timing file written before host tiers still loads, with no copy price
    old = {k: v for k, v in TIMING.to_dict().items() if "load" not in k and "kv_" not in k}
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert load_timing(str(tmp_path / "old.json")) == TIMING.with_(
        kv_bytes_per_token=0, load_bytes_per_s=0.0, load_overhead_s=0.0
    )
    gpu = timing_preset("gpu")
    assert gpu.kv_bytes_per_token == 128 * 1024 and gpu.load_bytes_per_s == 50e9


def _indexed(load_bytes_per_s: float) -> tuple[list[SimWorker], ApproxIndex, Workload]:
    """Worker 0 holds A's prefix on its host tier only; worker 1 is empty. The index learns both
    from their events."""
    wl = _workload()
    timing = TIMING.with_(load_bytes_per_s=load_bytes_per_s)
    workers = [SimWorker(i, 8, P, timing, wl, host_pages=32) for i in (0, 1)]
    index = ApproxIndex(P, 64)
    for w in workers:
        index.add_worker(w.worker_id)
    _run(workers[0], wl, 1)
    while workers[0].busy:
        workers[0].step_end(10.0)
    for w in workers:
        index.apply(w.worker_id, w.cache.take_events())
    return workers, index, wl


@pytest.mark.parametrize("rate, holder", [(1e7, 0), (1e5, 1)])
def test_ttft_in_the_simulator_loads_back_when_the_load_is_cheap(rate, holder):
    workers, index, wl = _indexed(rate)
    assert index.match_tiers(wl.block_hashes(P)[2]) == {0: (0, 6)}
    req = RoutingRequest(2, 28, wl.block_hashes(P)[2], None, 20.0)
    states = [w.state() for w in workers]
    # 24 tokens: a load of 0.002 + 0.0024 s at 10 MB/s against ~0.024 s of prefill (1 ms a token);
    # at 100 KB/s (0.24 s) recomputing on the idle worker wins
    d = make_policy("ttft", reuse_weight=0.0).choose(req, states, index)
    assert d.worker_id == holder
    blind = make_policy("ttft:tiers=false", reuse_weight=0.0).choose(req, states, index)
    assert blind.predicted_cached_tokens == 0
