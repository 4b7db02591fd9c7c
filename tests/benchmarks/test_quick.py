"""Every benchmark and study runs in its quick mode: a change that breaks a benchmark fails here.

Each script runs in a subprocess (as a reader runs it), with this checkout first on the path,
its working directory and every output it writes in a temporary folder, never in the repository.
All of them are in the integration tier (`make test`, CI), not in `make test-fast`: each is a fresh
interpreter that imports torch, seconds apiece of the inner loop; the marks per script below
say which also start servers, worker processes or child processes. Those run one at a time;
the others only compute, and `make test` runs them two at once (`parallel_safe`).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from radixray.sim.data import DATA_ENV, mooncake_trace_path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"

integration = pytest.mark.integration
pytestmark = integration


def _have_trace() -> bool:
    try:
        return mooncake_trace_path().is_file()
    except FileNotFoundError:
        return False


# lm-evaluation-harness is heavy (datasets, pandas, scikit-learn): not a dev dependency; its
# benchmark runs where it is installed (the script's docstring says how).
needs_lm_eval = pytest.mark.skipif(
    importlib.util.find_spec("lm_eval") is None,
    reason="lm-evaluation-harness is not installed (pip install lm-eval==0.4.13 torch==2.13.0)",
)

needs_trace = pytest.mark.skipif(
    not _have_trace(), reason=f"the Mooncake trace is not in the data folder (set {DATA_ENV})"
)

# script (relative to benchmarks/) -> (extra arguments, {out} = the tmp folder; a line the run
# must print; marks). Every script in benchmarks/ and in its studies/ and gpu/ is listed.
CASES = {
    "bench_cache_index.py": ([], "ApproxIndex", ()),
    "bench_protocol.py": ([], "poll result (4 KB events)", ()),
    "bench_policy_cpu.py": ([], "| router | ttft | 2 |", ()),
    "bench_kernels.py": ([], "speed-up", ()),
    "bench_sim.py": (["--out", "{out}/bench_sim.json"], "hot_prefix", (needs_trace,)),
    "bench_sim_load.py": (["--out", "{out}/load.json"], "sustainable rate", (needs_trace,)),
    "bench_sim_tiers.py": (["--out", "{out}/tiers.json"], "excess p50 vs all-device", ()),
    "bench_engine.py": (["--json", "{out}/bench_engine.json"], "TTFT 128 tokens", (integration,)),
    "bench_hybrid_engine.py": (["--json", "{out}/hybrid.json"], "lfm2: ", (integration,)),
    "bench_structured.py": ([], "| llguidance |", ()),
    "bench_host_step.py": ([], "| 8 |", ()),
    "bench_overlap.py": ([], "| True |", ()),
    "bench_detokenizer.py": ([], "| 256 | none |", ()),
    "bench_instructor.py": ([], "JSON_SCHEMA  closed (default)", (integration,)),
    "bench_lm_eval.py": ([], "max |Δ loglik| vs HF float32", (integration, needs_lm_eval)),
    "bench_samples.py": ([], "| n=4 |", ()),
    "bench_logprobs.py": ([], "| top_logprobs=20 |", ()),
    "bench_host_tier.py": ([], "| loaded back from host |", ()),
    "bench_tier_steps.py": (["--out", "{out}/steps.json"], "| host pages |", (needs_trace,)),
    "bench_window_pool.py": ([], "held at end:", ()),
    "bench_sim_window.py": (["--out", "{out}/window.json"], "| window-blind |", ()),
    "bench_sim_hybrid.py": (["--out", "{out}/hybrid.json"], "| request ends |", ()),
    # the Ray target starts a Ray cluster (a minute here); `radixray serve` on Ray is tested in
    # tests/test_cli_serve.py
    "bench_router.py": (["--out", "{out}", "--targets", "smg", "http"], "|", (integration,)),
    "bench_router_inproc.py": (["--out", "{out}"], "64-token stream", ()),
    "bench_fleet.py": (["--out", "{out}", "--no-smg"], "|", (integration,)),
    "bench_serving.py": (["--out-dir", "{out}"], "bench_serving.json", (integration,)),
    "bench_sim_vs_live.py": (
        ["--out-dir", "{out}"],
        "|",
        (integration, needs_trace),
    ),
    "gpu/engine_check.py": (["--json", "{out}/engine_check.json"], "exactness vs CPU: EQUAL", ()),
    "gpu/profile_step.py": (["--out", "{out}"], "forward:", ()),
    "gpu/big_check.py": (["--json", "{out}/big.json"], "nano-vllm's offline workload", ()),
    "gpu/state_kernels.py": ([], "compiled ssd_decode (fp32) for sm_90", ()),
    "gpu/sim_timing.py": (["--out", "{out}"], "radixray sim --timing", ()),
    "gpu/split_kv.py": ([], "chosen splits at 132 SMs", ()),
    # Ray, an actor and the router on the embedded model (~12-20 s here): the kit's step (g)
    "gpu/serve_check.py": (["--json", "{out}/serve.json"], "serve check: OK", (integration,)),
    "studies/bench_burst.py": ([], "| ttft | shared | 2 |", ()),
    "studies/live_speed_adjusted.py": ([], "ttft_p50_s: x", (integration,)),
    "studies/live_regimes.py": (["--out", "{out}"], "| mooncake@4 | radixray", (integration,)),
    "studies/sim_capacity_bound.py": ([], "ttft excess_p50", (needs_trace,)),
    "studies/sim_excess_breakdown.py": ([], "| ttft |", (needs_trace,)),
    "studies/sim_hit_moves.py": ([], "| ttft | 0.", (needs_trace,)),
    "studies/sim_light_load.py": (["--out", "{out}/light.json"], "| 0.1 | ttft |", (needs_trace,)),
    "studies/sim_live_regime.py": ([], "| ttft |", (needs_trace,)),
    "studies/sim_median_anatomy.py": ([], "| ttft | all |", (needs_trace,)),
    "studies/sim_seed_spread.py": ([], "ttft / best other", (needs_trace,)),
}


@pytest.mark.parallel_safe
def test_every_benchmark_script_has_a_quick_run():
    scripts = {p.relative_to(BENCH).as_posix() for p in BENCH.glob("*.py")}
    scripts |= {p.relative_to(BENCH).as_posix() for p in BENCH.glob("studies/*.py")}
    scripts |= {p.relative_to(BENCH).as_posix() for p in BENCH.glob("gpu/*.py")}
    assert scripts == set(CASES)


def _marks(marks: tuple) -> tuple:
    """A script with no `integration` mark of its own starts no server and asserts on no time:
    it may run beside another test (`make test`'s two-process pass)."""
    return marks if integration in marks else (*marks, pytest.mark.parallel_safe)


@pytest.mark.parametrize(
    "script",
    [pytest.param(name, marks=_marks(marks), id=name) for name, (_, _, marks) in CASES.items()],
)
def test_quick_run(script: str, tmp_path: Path):
    args, expect, _ = CASES[script]
    out = tmp_path / "out"
    out.mkdir()
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": "1",
        "RAY_AUTH_MODE": "disabled",
        "MPLBACKEND": "Agg",
    }
    cmd = [sys.executable, str(BENCH / script), "--quick", *(a.format(out=out) for a in args)]
    proc = subprocess.run(
        cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540, check=False
    )
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0, f"{script} --quick exited {proc.returncode}:\n{tail}"
    assert expect in proc.stdout, f"{script} --quick did not print {expect!r}:\n{tail}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"], "wrote outside its out folder"
