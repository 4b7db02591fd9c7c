"""Simulator invariants: every request finishes once, hits never beat an independently computed
infinite-cache ceiling, caches are intact at the end, one seed gives one result."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random

import pytest

from radixray.sim import (
    SimConfig,
    azure_shared_prefix,
    ceiling,
    load_mooncake,
    mooncake_trace_path,
    multiturn_chat,
    simulate,
    timing_preset,
)
from radixray.sim.data import data_dir
from radixray.sim.sim_cli import main

BT = 16  # block tokens == page size


def write_trace(path, n=300, seed=0):
    """A small trace in the Mooncake format: a shared block 0, conversations that grow."""
    rng = random.Random(seed)
    convs: list[list[int]] = []
    next_id = 1
    lines = []
    for i in range(n):
        if convs and rng.random() < 0.6:
            c = rng.choice(convs)
        else:
            c = [0]
            convs.append(c)
        add = rng.randint(1, 4)
        c.extend(range(next_id, next_id + add))
        next_id += add
        blocks = list(c)
        inp = (len(blocks) - 1) * 512 + rng.randint(1, 512)
        lines.append(
            {
                "timestamp": (i // 3) * 1000,
                "input_length": inp,
                "output_length": rng.randint(1, 200),
                "hash_ids": blocks,
            }
        )
    with open(path, "w") as f:
        for obj in lines:
            f.write(json.dumps(obj) + "\n")
    return lines


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "small.jsonl"
    rows = write_trace(path)
    return path, rows


def independent_ceiling(rows, block_tokens=BT, scale=32):
    """Ceiling from the raw hash_ids: a full page = a full block; a request can reuse the leading
    blocks (within its first L - 1 tokens) that some earlier request had as full blocks."""
    seen = set()
    hit = total = 0
    for r in rows:
        ids = r["hash_ids"]
        n = len(ids)
        length = min(max(round(r["input_length"] / scale), (n - 1) * block_tokens + 1),
                     n * block_tokens)  # fmt: skip
        total += length
        full = length // block_tokens
        cap = (length - 1) // block_tokens
        k = 0
        while k < cap and tuple(ids[: k + 1]) in seen:
            k += 1
        hit += k * block_tokens
        seen.update(tuple(ids[: j + 1]) for j in range(full))
    return hit, total


def run(wl, policy="ttft", **kw):
    cfg = SimConfig(**{"num_workers": 4, "num_pages": 512, "page_size": BT, **kw})
    return simulate(wl, policy, cfg)


@pytest.fixture(scope="module")
def trace_runs(trace):
    """policy -> its run over the trace at speedup 4 on ``run``'s cluster, every cache's
    integrity checked every 40 steps: simulated once for the module, read by several tests."""
    wl = load_mooncake(trace[0], block_tokens=BT, speedup=4.0)
    made = {}

    def get(policy: str):
        if policy not in made:
            made[policy] = run(wl, policy, check_every=40)
        return made[policy]

    return get


def test_trace_file_loads_and_ceiling_matches_independent_count(trace):
    path, rows = trace
    wl = load_mooncake(path, block_tokens=BT, speedup=4.0)
    assert len(wl) == len(rows)
    assert ceiling(wl, BT) == independent_ceiling(rows)
    assert wl.description["scale"] == 32


@pytest.mark.parametrize("policy", ["round_robin", "cache_aware", "kv_cost", "ttft"])
def test_every_request_finishes_once_and_hits_stay_under_the_ceiling(trace, trace_runs, policy):
    _, rows = trace
    res = trace_runs(policy)  # integrity of every cache every 40 steps
    assert len(res.records) == len(rows)
    for rec in res.records:
        assert rec.arrival <= rec.first_token <= rec.finish
        assert 0 <= rec.cached <= rec.prompt_tokens - 1
    ceil_hit, total = independent_ceiling(rows)
    s = res.summary()
    assert sum(r.cached for r in res.records) <= ceil_hit
    assert s["hit_rate"] <= ceil_hit / total + 1e-12
    assert math.isfinite(s["ttft_p99"]) and s["imbalance"] >= 1.0


def test_same_seed_same_result(trace):
    path, _ = trace
    a = run(load_mooncake(path, block_tokens=BT, speedup=4.0, seed=3), "random", seed=5)
    b = run(load_mooncake(path, block_tokens=BT, speedup=4.0, seed=3), "random", seed=5)
    c = run(load_mooncake(path, block_tokens=BT, speedup=4.0, seed=3), "random", seed=6)
    key = [(r.worker, r.first_token, r.finish, r.cached) for r in a.records]
    assert key == [(r.worker, r.first_token, r.finish, r.cached) for r in b.records]
    assert [r.worker for r in a.records] != [r.worker for r in c.records]


def test_cache_affinity_beats_round_robin_on_hits(trace_runs):
    rr = trace_runs("round_robin").summary()["hit_rate"]
    assert trace_runs("cache_aware").summary()["hit_rate"] > rr
    assert trace_runs("ttft").summary()["hit_rate"] > rr


@pytest.mark.parametrize(
    "delay,optimistic", [(None, True), (0.0, False), (0.0, True), (1.0, True), (1.0, False)]
)
def test_index_views_all_run(trace, delay, optimistic):
    path, _ = trace
    wl = load_mooncake(path, block_tokens=BT, speedup=4.0)
    s = run(wl, "cache_aware", event_delay_s=delay, optimistic_index=optimistic).summary()
    assert s["index_memory_bytes"] > 0 and s["requests"] == len(wl)


def test_small_cache_evicts_and_oversize_requests_still_finish(trace, trace_runs):
    path, _ = trace
    wl = load_mooncake(path, block_tokens=BT, speedup=4.0)
    res = run(wl, "ttft", num_pages=24, check_every=10)
    assert res.oversize > 0
    assert res.summary()["hit_rate"] < trace_runs("ttft").summary()["hit_rate"]


def test_multiturn_chat_reuses_answers_and_lfu_runs():
    wl = multiturn_chat(num_requests=300, num_sessions=20, rate=2.0, seed=1)
    res = run(wl, "ttft", check_every=25)
    ceil_hit, total = ceiling(wl, BT)
    hit = sum(r.cached for r in res.records)
    assert 0.5 * ceil_hit < hit <= ceil_hit
    run(wl, "cache_aware", eviction="lfu", num_pages=128, check_every=25)


def test_gpu_timing_preset_is_faster():
    wl = multiturn_chat(num_requests=100, num_sessions=10, seed=2)
    cpu = run(wl, "round_robin").summary()["ttft_p50"]
    gpu = run(wl, "round_robin", timing=timing_preset("gpu")).summary()["ttft_p50"]
    assert gpu < cpu / 10
    with pytest.raises(ValueError, match="timing preset must be one of"):
        timing_preset("tpu")


def test_data_dir_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("RADIXRAY_DATA_DIR", str(tmp_path))
    assert data_dir() == tmp_path
    with pytest.raises(FileNotFoundError, match="RADIXRAY_DATA_DIR"):
        load_mooncake("mooncake")
    (tmp_path / "mooncake").mkdir()
    write_trace(tmp_path / "mooncake" / "conversation_trace.jsonl", n=50)
    assert mooncake_trace_path() == tmp_path / "mooncake" / "conversation_trace.jsonl"
    assert len(load_mooncake("mooncake")) == 50


def test_bad_trace_line_names_the_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 5}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: not a Mooncake trace line"):
        load_mooncake(p)


def test_cli_writes_json_and_plot(trace, tmp_path, capsys):
    path, _ = trace
    out, png = tmp_path / "o.json", tmp_path / "o.png"
    rc = main(
        ["--trace", str(path), "--workers", "4", "--pages", "512", "--speedup", "4",
         "--policies", "round_robin,ttft", "--json", str(out), "--plot", str(png),
         "--no-progress"]
    )  # fmt: skip
    assert rc == 0
    data = json.loads(out.read_text())
    assert set(data) == {"round_robin", "ttft"}
    for v in data.values():
        assert {"hit_rate", "hit_rate_beyond_first_block", "ceiling", "ttft_p50", "ttft_p99",
                "throughput", "imbalance"} <= set(v)  # fmt: skip
    assert png.stat().st_size > 1000
    assert "ttft" in capsys.readouterr().out
    assert main(["--policies", "nope", "--no-progress"]) == 2


def test_mooncake_slice_and_azure_generator():
    wl = load_mooncake("mooncake", limit=400)
    assert len(wl) == 400 and wl.first_block_tokens == BT
    s = run(wl, "kv_cost").summary()
    assert 0 < s["hit_rate"] <= s["ceiling"]
    az = azure_shared_prefix(num_requests=200, num_groups=4)
    s = run(az, "cache_aware").summary()
    assert 0 < s["hit_rate"] <= s["ceiling"]


def test_the_step_hook_sees_every_step_each_worker_runs(trace):
    """``on_step`` gets every step as it starts: on each worker they do not overlap, their
    lengths add up to the worker's busy time, and every first token comes at the end of a
    step of its own worker that carries the last chunk of its prompt."""
    wl = load_mooncake(trace[0], block_tokens=BT, speedup=8.0)
    steps: dict[int, list] = {}

    def on_step(worker_id, start, dt, batch):
        ends = {it.req.request_id for it in batch.items if it.sample and not it.req.output_ids}
        steps.setdefault(worker_id, []).append((start, dt, ends))

    cfg = SimConfig(num_workers=3, num_pages=512, page_size=BT)
    result = simulate(wl, "ttft", cfg, on_step=on_step)
    plain = simulate(wl, "ttft", cfg)  # watching changes nothing
    assert [(r.worker, r.first_token, r.cached) for r in result.records] == [
        (r.worker, r.first_token, r.cached) for r in plain.records
    ]
    assert sorted(steps) == [0, 1, 2]
    for w, log in steps.items():
        for (s0, d0, _), (s1, _, _) in itertools.pairwise(log):
            assert s1 >= s0 + d0 - 1e-12
        assert sum(d for _, d, _ in log) == pytest.approx(result.busy_time[w], rel=1e-12)
    first = {(w, s + d): e for w, log in steps.items() for s, d, e in log}
    for rec in result.records:
        assert str(rec.rid) in first[(rec.worker, rec.first_token)]


def test_admission_refuses_as_the_router_does_and_reports_the_refused():
    """With the live router's admission modelled, arrivals beyond the in-flight limit are
    refused (never routed) and counted apart; the served requests' figures leave them out."""
    from radixray.sim import SimRequest, Workload

    reqs = [SimRequest(i, 0.001 * i, ((i + 1, 64),), 4) for i in range(40)]  # a burst
    wl = Workload("burst", reqs, 16)
    base = SimConfig(num_workers=2, num_pages=256, page_size=16)
    served = simulate(wl, "ttft", base).summary()
    assert served["refused"] == 0 and served["requests"] == 40
    limited = simulate(wl, "ttft", dataclasses.replace(base, max_inflight=5))
    s = limited.summary()
    refused = [r for r in limited.records if r.worker == -1]
    assert s["refused"] == len(refused) > 0 and s["requests"] + s["refused"] == 40
    assert all(r.worker >= 0 for r in limited.records[:5])  # the first 5 fit the limit
    assert sum(limited.per_worker()["requests"]) == s["requests"]
    assert s["ttft_p99"] <= served["ttft_p99"]  # fewer queued ahead of the served ones
    per_worker = simulate(wl, "ttft", dataclasses.replace(base, max_inflight_per_worker=3))
    assert 0 < per_worker.summary()["refused"] < 40
    # The queueing-delay limit: refuses once the shortest queue holds more prefill than the
    # limit's seconds at the workers' rate; the first arrivals (empty queues) are served.
    timing = base.timing
    per_request = timing.step_time(0, 0, 64, 0)  # one 64-token prefill, seconds
    by_queue = simulate(wl, "ttft", dataclasses.replace(base, max_queue_s=2.5 * per_request))
    q = by_queue.summary()
    assert 0 < q["refused"] < 40
    assert all(r.worker >= 0 for r in by_queue.records[:2])  # one on each empty worker
    loose = simulate(wl, "ttft", dataclasses.replace(base, max_queue_s=1e6)).summary()
    assert loose["refused"] == 0
    with pytest.raises(ValueError, match="max_queue_s"):
        SimConfig(max_queue_s=0)
    with pytest.raises(ValueError, match="max_inflight"):
        SimConfig(max_inflight=0)
