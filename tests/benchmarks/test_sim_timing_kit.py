"""The GPU kit's simulator timing (benchmarks/gpu/sim_timing.py) on the CPU with the tiny model:
the file it writes is named for the card, the date and the shapes, and `radixray sim --timing`
runs with it. No GPU."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import torch

KIT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"


def _kit(name: str):
    path = list(sys.path)
    sys.path.insert(0, str(KIT))  # big_check imports sim_timing by name, as the kit runs it
    try:
        spec = importlib.util.spec_from_file_location(name, KIT / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path[:] = path  # as it was (the scripts add the repository and their folder)
    return mod


def test_file_names_keep_to_the_device_tools_characters():
    st = _kit("sim_timing")
    name = st.file_name("NVIDIA H100 80GB HBM3", "2026-12-07", "llama-3.1-8b-shapes")
    assert name == "timing_NVIDIA-H100-80GB-HBM3_2026-12-07_llama-3.1-8b-shapes.json"


def test_the_dry_runs_timing_file_is_what_radixray_sim_reads(tmp_path, capsys):
    from radixray.model_meta import tiny_config
    from radixray.sim.sim_cli import main as sim_main

    big = _kit("big_check")
    loaded = big.load(tiny_config(), "cpu", torch.float32)  # as big_check.py --quick
    got = big.sim_timing.fit_and_write(loaded, "cpu", True, tmp_path)
    path = Path(got["file"])
    assert path.parent == tmp_path and path.name.startswith("timing_cpu_")
    data = json.loads(path.read_text())
    assert data["fit"]["model"] == "tiny" and data["fit"]["device"] == "cpu"
    assert data["fit"]["dtype"] == "float32" and data["fit"]["clock"] == "forward"
    assert data["fit"]["samples"] == len(data["samples"]) >= 5
    assert data["prefill_token_s"] > 0 and data["kv_bytes_per_token"] > 0  # the host tier's too
    assert data["max_batch_tokens"] == 1024 and data["max_running"] == 16  # as the engine ran
    capsys.readouterr()
    argv = ["--workload", "hot_prefix", "--limit", "100", "--workers", "2", "--no-progress"]
    assert sim_main([*argv, "--policies", "ttft", "--timing", str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[-2].startswith("bound")
