"""The load generator, counters and report against a real worker app (tiny model)."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import replace

from radixray.bench.bench_cli import main as bench_main
from radixray.bench.counters import counter_delta, worker_counters
from radixray.bench.loadgen import LoadConfig, run_load, session_starts
from radixray.bench.report import breakdown_table, markdown_table, plot, summarize
from radixray.bench.workloads import BenchWorkload, Session, Turn, block_text

SHARED = "".join(block_text(i, 16) for i in range(4))  # 64 shared characters = 4 pages


def _workload(n: int = 6) -> BenchWorkload:
    sessions = [
        Session(
            f"c{i}", "completion", (Turn(SHARED + f" request {i}", 4),), shared_prefix_tokens=16
        )
        for i in range(n)
    ]
    sessions.append(
        Session("chat", "chat", (Turn("first", 3), Turn("second", 3)), system=SHARED * 2)
    )
    return BenchWorkload("synthetic", tuple(sessions))


def test_concurrency_run_measures_streams_usage_and_worker_counters(worker_app, tmp_path):
    url, _ = worker_app
    wl = _workload()
    before = asyncio.run(worker_counters([url]))
    cfg = LoadConfig(mode="concurrency", concurrency=3, max_requests=50, progress=False)
    run = asyncio.run(run_load(url, wl, cfg, model="tiny", target="t"))
    assert len(run.requests) == wl.num_requests
    assert all(r.ok for r in run.requests), [r.error for r in run.requests]
    # The worker's counters take in the last requests at its next refresh: wait for them there.
    sent = sum(r.prompt_tokens for r in run.requests)
    deadline = time.monotonic() + 60  # a guard against a hang only
    while True:
        after = asyncio.run(worker_counters([url]))
        if counter_delta(before, after)["total"]["prompt_tokens"] == sent:
            break
        assert time.monotonic() < deadline, (counter_delta(before, after), sent)
        time.sleep(0.05)
    for r in run.requests:
        assert 0 < r.ttft_s <= r.e2e_s and r.completion_tokens >= 1 and r.worker == "w0"
        assert all(x >= 0 for x in r.itl_s)
    first = next(r for r in run.requests if r.session_id == "c0")
    assert first.prompt_tokens == len(SHARED + " request 0")
    turn1, turn2 = (r for r in run.requests if r.session_id == "chat")
    # Turn 2 reuses every whole page of turn 1's prompt (system prompt and question), and of
    # the answer what its text re-encodes to alike (this test keeps no token ids: not known
    # here; test_token_ids_are_kept_and_a_next_turn_hits_what_the_first_left knows it exactly)
    assert (
        turn1.prompt_tokens // 16 * 16
        <= turn2.cached_tokens
        <= (turn2.prompt_tokens - 1) // 16 * 16
    )
    delta = counter_delta(before, after)
    assert delta["total"]["prompt_tokens"] == sent
    assert delta["total"]["cached_tokens"] == sum(r.cached_tokens for r in run.requests)
    row = summarize(run, delta) | {"router": "direct", "policy": "-"}
    assert row["ok"] == wl.num_requests and row["errors"] == 0 and 0 < row["hit_rate"] < 1
    assert row["ttft_p50_s"] <= row["ttft_p99_s"] and row["throughput_rps"] > 0
    assert "| direct | - |" in markdown_table([row])
    assert row["uncached_tokens_per_request"] > 0 and row["max_worker_share"] == 1.0
    assert "| direct | - |" in breakdown_table([row])
    plot(tmp_path / "p.png", {"synthetic": [("direct", [r.ttft_s for r in run.requests], 0.5)]})
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_rate_mode_respects_request_and_time_limits(worker_app):
    url, _ = worker_app
    wl = _workload(40)
    cfg = LoadConfig(mode="rate", rate=50.0, max_requests=5, progress=False, seed=3)
    run = asyncio.run(run_load(url, wl, cfg, model="tiny"))
    assert len(run.requests) == 5 and all(r.ok for r in run.requests)
    starts = [r.start_s for r in run.requests]
    assert starts == sorted(starts) and starts[-1] > 0
    # The time limit: nothing starts after max_duration_s, so of the seeded arrivals only those
    # before it can run (3 here, of 40 sessions), whatever this machine's speed.
    cfg = LoadConfig(mode="rate", rate=5.0, max_duration_s=0.5, drain_s=60, progress=False, seed=9)
    arrivals = session_starts(cfg.rate, cfg.seed)
    due = sum(1 for _ in itertools.takewhile(lambda t: t < cfg.max_duration_s, arrivals))
    run = asyncio.run(run_load(url, wl, cfg, model="tiny"))
    assert due == 3 and len(run.requests) <= due and all(r.ok for r in run.requests)
    assert all(r.start_s < cfg.max_duration_s for r in run.requests), run.requests


def test_errors_are_recorded_not_raised(worker_app):
    url, _ = worker_app
    wl = BenchWorkload("bad", (Session("s", "completion", (Turn("x", 4),)),))
    run = asyncio.run(run_load(url, wl, LoadConfig(progress=False), model="no-such-model"))
    (r,) = run.requests
    assert not r.ok and r.status == 404 and "model" in r.error
    dead = asyncio.run(run_load("http://127.0.0.1:9", wl, LoadConfig(progress=False)))
    assert not dead.requests[0].ok and "ConnectError" in dead.requests[0].error
    assert summarize(dead)["errors"] == 1


def test_cli_run_writes_a_report(worker_app, tmp_path, capsys):
    url, _ = worker_app
    out = tmp_path / "r.json"
    argv = ["run", "--url", url, "--workload", "mtbench", "--mode", "concurrency"]
    argv += ["--concurrency", "2", "--max-requests", "3", "--mtbench-sessions", "2"]
    argv += ["--system-chars", "200", "--chat-max-tokens", "2", "--worker-urls", url]
    argv += ["--out", str(out), "--no-progress"]
    rc = bench_main(argv)
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["summary"]["ok"] == 3 and "hit_rate" in report["summary"]
    assert len(report["requests"]) == 3
    assert "cluster hit rate" in capsys.readouterr().out


def test_repeats_pool_requests_in_time_and_sum_counters():
    from radixray.bench.compare import _pool
    from radixray.bench.loadgen import RequestResult, RunResult

    def run(n):
        reqs = [
            RequestResult(f"s{i}", 0, float(i), ok=True, ttft_s=0.1, e2e_s=0.5) for i in range(n)
        ]
        return RunResult("t", "u", LoadConfig(), reqs, float(n), 0.0)

    def delta(p, c):
        return {
            "total": {
                "prompt_tokens": p,
                "cached_tokens": c,
                "evicted_pages": 0,
                "preemptions": 0,
                "miss_tokens": {"cached": c, "cold": p - c},
                "hit_rate": c / p,
            },
            "workers": {},
        }

    pooled, merged = _pool([(run(3), delta(100, 50)), (run(2), delta(300, 50))])
    assert [r.start_s for r in pooled.requests] == [0.0, 1.0, 2.0, 2.5, 3.5]
    assert pooled.duration_s == 5.0
    assert merged["total"]["hit_rate"] == 0.25
    assert merged["total"]["miss_tokens"] == {"cached": 100, "cold": 300}


def test_token_ids_are_kept_and_a_next_turn_hits_what_the_first_left(worker_app):
    """With ``return_token_ids`` every request keeps the ids the engine saw and sampled; a chat's
    second turn then reuses exactly the pages its first turn's prompt and answer share with it."""
    url, _ = worker_app
    system = "token ids kept by the load generator. " * 5
    chat = Session("ids", "chat", (Turn("first", 5), Turn("second", 3)), system=system)
    done = Session("c-ids", "completion", (Turn(SHARED + " ids", 4),))
    cfg = LoadConfig(mode="concurrency", concurrency=1, progress=False, return_token_ids=True)
    run = asyncio.run(run_load(url, BenchWorkload("ids", (done, chat)), cfg, model="tiny"))
    assert all(r.ok for r in run.requests), [r.error for r in run.requests]
    for r in run.requests:
        assert len(r.prompt_ids) == r.prompt_tokens and len(r.output_ids) == r.completion_tokens
        assert r.as_dict()["output_ids"] == r.output_ids
    assert run.requests[0].prompt_ids == list((SHARED + " ids").encode())
    t1, t2 = run.requests[1:]
    left = t1.prompt_ids + t1.output_ids[:-1]  # the last sampled token was never computed
    common = next(
        (k for k, (a, b) in enumerate(zip(left, t2.prompt_ids, strict=False)) if a != b),
        min(len(left), len(t2.prompt_ids)),
    )
    assert common > len(t1.prompt_ids)  # the answer is part of what turn 2 can reuse
    assert t2.cached_tokens == min(common, len(t2.prompt_ids) - 1) // 16 * 16
    plain = asyncio.run(
        run_load(url, BenchWorkload("x", (done,)), replace(cfg, return_token_ids=False))
    )
    assert plain.requests[0].prompt_ids is None and "prompt_ids" not in plain.requests[0].as_dict()
