"""bench_sim_tiers's seeds: each seed's rows joined from several files, their medians, and the
targets checked where the rows allow (no simulation here: hand-made rows)."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

BENCH = runpy.run_path(str(Path(__file__).resolve().parents[2] / "benchmarks/bench_sim_tiers.py"))
TIERED, DEVICE, CEILING = "2000 + 8000 host", "2000 device", "10000 device"


def _row(cluster: str, policy: str, x: float) -> dict:
    keys = (*BENCH["KEYS"], "host_share", "delay_p99", "excess_p98.9", "excess_p99.1")
    return {"cluster": cluster, "policy": policy, **dict.fromkeys(keys, x),
            "p99_requests": {"ttft": x, "n": 1}}  # fmt: skip


def test_rows_of_a_seed_join_from_files_in_report_order_and_medians_skip_missing_runs(tmp_path):
    args = vars(BENCH["parse_args"]([]))
    files = {  # seed 0: the ceiling and ttft in one file, the baselines in another; seed 1: two
        "a0": {0: [_row(CEILING, "ttft", 0.2), _row(TIERED, "ttft", 0.1)]},
        "b0": {0: [_row(TIERED, b, 0.4) for b in BENCH["BASELINES"]]},
        "a1": {1: [_row(TIERED, "ttft", 0.3), _row(CEILING, "ttft", 0.2)]},
    }
    for name, seeds in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps({"args": args, "seeds": seeds}))
    seeds, per_seed, _ = BENCH["merged"](",".join(str(tmp_path / f"{n}.json") for n in files))
    assert seeds == [0, 1]
    assert [(r["cluster"], r["policy"]) for r in per_seed[0]] == [
        (TIERED, "ttft"),
        *((TIERED, b) for b in BENCH["BASELINES"]),
        (CEILING, "ttft"),
    ]
    med = {(r["cluster"], r["policy"]): r for r in BENCH["median_rows"](per_seed)}
    assert med[(TIERED, "ttft")]["excess_p99"] == pytest.approx(0.2)  # median of 0.1 and 0.3
    assert med[(TIERED, "ttft")]["seeds"] == 2
    assert med[(TIERED, BENCH["BASELINES"][0])]["seeds"] == 1
    # seed 0 has the ceiling and the baselines (not tier-blind): capacity and placement targets
    checks = {c[0]: c for c in BENCH["targets"](per_seed[0])}
    assert checks["excess p99 vs all-device"][1] == pytest.approx(0.5)
    assert checks["pooled_excess_p99 vs best baseline"][1:] == (pytest.approx(0.25), "<= 0.5", True)
    assert "excess p50 vs best other on tiers" not in checks  # needs every tiered policy
    assert {c[0] for c in BENCH["targets"](per_seed[1])} == {
        "hit vs all-device",
        "excess p50 vs all-device",
        "excess p99 vs all-device",
    }
    medians = {c[0]: c for c in BENCH["median_targets"]([BENCH["targets"](r) for r in per_seed])}
    what, x, target, met, each = medians["excess p99 vs all-device"]
    assert each == [pytest.approx(0.5), pytest.approx(1.5)] and x == pytest.approx(1.0) and met
