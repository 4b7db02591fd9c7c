"""A live benchmark's targets and worker flags: how a target spec parses, which worker command
line each target's runs start, and the report's per-tier columns (no processes started)."""

from __future__ import annotations

import pytest

from radixray.bench import bench_cli
from radixray.bench.compare import CompareConfig
from radixray.bench.loadgen import LoadConfig, RequestResult, RunResult
from radixray.bench.local_cluster import WorkerSpec
from radixray.bench.peer_smg import smg_command
from radixray.bench.report import median_table, summarize, tier_table
from radixray.bench.targets import parse_target


def test_a_target_names_router_policy_spec_and_worker_overrides():
    t = parse_target("radixray:ttft:tiers=false")
    assert (t.router, t.policy, t.worker) == ("radixray", "ttft:tiers=false", {})
    t = parse_target("radixray:ttft@host-pages=0")
    assert (t.router, t.policy, t.worker) == ("radixray", "ttft", {"host_pages": 0})
    t = parse_target("smg:cache_aware@host-pages=96,num-pages=48")
    assert (t.router, t.policy) == ("smg", "cache_aware")
    assert t.worker == {"host_pages": 96, "num_pages": 48}
    assert t.name == "smg:cache_aware@host-pages=96,num-pages=48"


def test_an_smg_target_carries_its_flags_to_the_command_line():
    t = parse_target("smg:cache_aware:cache-threshold=0.5,max-tree-size=49152@num-pages=768")
    assert (t.router, t.policy, t.worker) == (
        "smg",
        "cache_aware:cache-threshold=0.5,max-tree-size=49152",
        {"num_pages": 768},
    )
    cmd = smg_command(9000, ["http://127.0.0.1:9001"], t.policy, 9100, timeout_s=30)
    assert cmd[cmd.index("--policy") + 1] == "cache_aware"
    assert cmd[cmd.index("--cache-threshold") + 1] == "0.5"
    assert cmd[cmd.index("--max-tree-size") + 1] == "49152"
    assert cmd[cmd.index("--worker-urls") + 1] == "http://127.0.0.1:9001"


@pytest.mark.parametrize(
    "spec, words",
    [
        ("vllm:ttft", "radixray:<policy>"),
        ("radixray", "radixray:<policy>"),
        ("radixray:ttft@hostpages=3", "'hostpages=3'"),
        ("radixray:ttft@host-pages", "'host-pages'"),
        ("radixray:ttft@host-pages=-1", "host-pages must be an int >= 0"),
        ("radixray:ttft@host-pages=two", "host-pages must be an int >= 0"),
        ("sglang:cache_aware", "radixray:<policy>, smg:<policy> or smg-grpc:<policy>"),
        ("smg:cache_aware:cache-threshold=2", "cache-threshold must be a number in"),
        ("smg:cache_aware:tree=3", "KEY one of"),
        ("smg:cache_aware:balance-rel-threshold=0.5", "balance-rel-threshold must be a num"),
    ],
)
def test_bad_targets_are_refused_with_what_is_wrong(spec, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[")):
        parse_target(spec)
    with pytest.raises(ValueError):
        CompareConfig(out_dir=".", targets=(spec,))


def test_worker_command_line_carries_host_pages_only_when_set():
    base = WorkerSpec(model="tiny", page_size=16, num_pages=384, cpu_threads=1)
    assert "--host-pages" not in base.args()
    tiered = parse_target("radixray:ttft").worker_spec(WorkerSpec(num_pages=384, host_pages=1536))
    args = tiered.args()
    assert args[args.index("--host-pages") + 1] == "1536"
    assert args[args.index("--num-pages") + 1] == "384"
    off = parse_target("radixray:ttft@host-pages=0").worker_spec(tiered)
    args = off.args()
    assert args[args.index("--host-pages") + 1] == "0"
    assert args[args.index("--num-pages") + 1] == "384"  # the rest of the spec kept


def test_compare_cli_passes_host_pages_and_targets_to_the_run(monkeypatch, capsys):
    seen = {}

    def fake_run(cfg):
        seen["cfg"] = cfg
        return {"workloads": {}}

    monkeypatch.setattr(bench_cli, "run_compare", fake_run)
    argv = ["compare", "--workloads", "mooncake", "--num-pages", "384", "--host-pages", "1536"]
    targets = ("radixray:ttft", "radixray:ttft:tiers=false", "radixray:ttft@host-pages=0")
    argv += ["--targets", *targets]
    argv += ["--probe-requests", "0", "--max-duration", "60", "--max-batch-tokens", "64"]
    assert bench_cli.main(argv) == 0
    cfg = seen["cfg"]
    assert cfg.worker.host_pages == 1536 and cfg.worker.num_pages == 384
    assert cfg.worker.args()[cfg.worker.args().index("--max-batch-tokens") + 1] == "64"
    assert cfg.targets == targets
    assert cfg.probe_requests == 0 and cfg.loads["mooncake"].max_duration_s == 60.0
    specs = [parse_target(t).worker_spec(cfg.worker).host_pages for t in cfg.targets]
    assert specs == [1536, 1536, 0]


def test_summary_counts_refusals_and_splits_reuse_by_tier():
    reqs = [
        RequestResult("a", 0, 0.0, ok=True, ttft_s=0.1, e2e_s=0.2, prompt_tokens=100),
        RequestResult("b", 0, 0.1, ok=False, status=429, error="HTTP 429"),
        RequestResult("c", 0, 0.2, ok=False, status=500, error="HTTP 500"),
    ]
    run = RunResult("t", "u", LoadConfig(), reqs, 1.0, 0.0)
    total = {
        "prompt_tokens": 200,
        "cached_tokens": 80,
        "evicted_pages": 0,
        "preemptions": 0,
        "hit_rate": 0.4,
        "miss_tokens": {"cached": 50, "host": 30, "evicted": 20, "cold": 100},
    }
    row = summarize(run, {"total": total, "workers": {}})
    assert (row["refused"], row["errors"]) == (1, 2)
    assert (row["device_hit_rate"], row["host_load_rate"]) == (0.25, 0.15)
    line = tier_table([row | {"router": "radixray", "policy": "ttft"}]).splitlines()[-1]
    # one request served in 0.2 s: 5 req/s
    assert line == "| radixray | ttft | 40.0% | 25.0% | 15.0% | 100 | 100 | 5.00 | 20 | 1 | 2 |"


def test_median_table_takes_medians_over_repeats_and_sums_refusals():
    def rep(hit, p50, refused, load):
        keys = ("hit_rate", "host_load_rate", "ttft_p50_s", "ttft_p99_s", "throughput_rps")
        vals = (hit, hit / 4, p50, 2 * p50, 10.0 * hit)
        return dict(zip(keys, vals, strict=True)) | {
            "refused": refused,
            "errors": refused,
            "load_avg": load,
            "router_ttft_p50_s": p50 / 2,
        }

    reps = [rep(0.3, 0.1, 0, 2.0), rep(0.5, 0.9, 3, 7.5), rep(0.4, 0.2, 1, 4.0)]
    row = {"router": "radixray", "policy": "ttft", "per_repeat": reps}
    line = median_table([row]).splitlines()[-1]
    want = "| radixray | ttft | 3 | 40.0% | 10.0% | 200 | 400 | 100 | 4.00 | 4 | 4 | 2.0-7.5 |"
    assert line == want
    two = median_table([row | {"per_repeat": reps[:2]}]).splitlines()[-1]
    assert "| 2 | 40.0% |" in two and "| 500 | 1000 |" in two  # even count: the mean of the two


def test_compare_cli_places_the_router_and_the_workers_on_cores(monkeypatch, capsys):
    seen = {}
    monkeypatch.setattr(
        bench_cli, "run_compare", lambda cfg: seen.setdefault("cfg", cfg) and {"workloads": {}}
    )
    monkeypatch.setattr(bench_cli.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    argv = ["compare", "--workloads", "mooncake", "--router-cpus", "0", "--worker-cpus", "1-3"]
    assert bench_cli.main(argv) == 0
    assert (seen["cfg"].router_cpus, seen["cfg"].worker_cpus) == ((0,), (1, 2, 3))
    for bad, words in (("5", "this process may use [0, 1, 2, 3]"), ("a-b", "expected cores")):
        with pytest.raises(SystemExit):
            bench_cli.main(["compare", "--router-cpus", bad])
        assert words in capsys.readouterr().err
