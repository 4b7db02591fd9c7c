"""bench_router's summary: a run too short for the CPU clock reports no ratio instead of failing."""

import runpy
from pathlib import Path
from types import SimpleNamespace

bench_router = SimpleNamespace(
    **runpy.run_path(str(Path(__file__).resolve().parents[2] / "benchmarks/bench_router.py"))
)


def _run(cpu_ms: float) -> dict:
    return {"cpu_ms_per_request": cpu_ms, "requests_per_s": 100.0, "failed": 0, "rss_mb": 50.0}


def _result(smg_ms: float, http_ms: float) -> dict:
    shapes = list(bench_router.SHAPES)
    return {
        "runs": {
            "smg": {s: [_run(smg_ms)] for s in shapes},
            "http": {s: [_run(http_ms)] for s in shapes},
        },
        "latency": {},
    }


def test_ratio_of_measured_runs():
    table = bench_router.summarize(_result(0.25, 0.5))
    assert table.count("HTTP / smg = 2.00x") == len(bench_router.SHAPES)


def test_a_run_under_one_clock_tick_has_no_ratio():
    # 80 requests at 0.1 ms each are 8 ms of CPU: under the 10 ms tick /proc counts in, so 0 ms.
    table = bench_router.summarize(_result(0.0, 0.5))
    assert table.count("HTTP / smg = n/a") == len(bench_router.SHAPES)
    assert "add --requests" in table
