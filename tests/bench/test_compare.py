"""``run_compare`` end to end on real ``radixray worker`` processes and radixray's router (tiny
model): the report keeps every request (with its token ids when asked), each router's decision
log and the workers' step logs, the inputs of bench_sim_vs_live.py's replay."""

from __future__ import annotations

import json

import pytest

from radixray.bench.compare import CompareConfig, run_compare
from radixray.bench.counters import step_totals
from radixray.bench.loadgen import LoadConfig
from radixray.bench.local_cluster import WorkerSpec

from ..router.serving import free_port

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
]


def test_the_report_keeps_requests_ids_decisions_and_steps(tmp_path):
    load = LoadConfig(mode="rate", rate=4.0, max_requests=6, progress=False, return_token_ids=True)
    cfg = CompareConfig(
        out_dir=tmp_path,
        workloads={"mtbench": {"num_sessions": 3, "system_chars": 200, "max_tokens": 4}},
        loads={"mtbench": load},
        targets=("radixray:ttft",),
        num_workers=2,
        worker=WorkerSpec(model="tiny", page_size=16, num_pages=256),
        base_port=free_port() // 100 * 100 % 40000 + 20000,
        probe_requests=2,
        step_logs=True,
    )
    report = run_compare(cfg)
    part = report["workloads"]["mtbench"]
    requests = part["requests"]["radixray:ttft"]
    assert len(requests) == 6 and all(r["ok"] for r in requests), requests
    for r in requests:
        assert len(r["prompt_ids"]) == r["prompt_tokens"]
        assert len(r["output_ids"]) == r["completion_tokens"]
    (log,) = part["decisions"]["radixray:ttft"]  # one run, one decision log
    assert len(log) == 6 and {d["worker_id"] for d in log} <= {"w0", "w1"}
    (steps,) = part["step_logs"]["radixray:ttft"]
    assert set(steps) == {f"http://127.0.0.1:{cfg.base_port + i}" for i in range(2)}
    assert sum(len(body["ttft"]) for body in steps.values()) == 6
    on_disk = json.loads((tmp_path / "bench_serving.json").read_text())
    assert on_disk["workloads"]["mtbench"]["decisions"]["radixray:ttft"] == [log]
    # the run's speed from its step logs: every uncached prompt token was computed in a step
    (row,) = part["rows"]
    (rep,) = row["per_repeat"]
    totals = row["worker_counters"]["total"]
    assert rep["step_period_ms"] > 0 and rep["ttft_mean_s"] > 0
    uncached = totals["prompt_tokens"] - totals["cached_tokens"]
    summed = step_totals(steps)
    assert summed["prefill_tokens"] == uncached > 0
    assert summed["steps"] == sum(len(body["log"]) for body in steps.values())
    assert rep["step_period_ms"] == pytest.approx(1000 * summed["period_s"] / summed["steps"])
