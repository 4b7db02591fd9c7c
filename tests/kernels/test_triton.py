"""Runs triton_cases.py in a subprocess: under TRITON_INTERPRET=1 on CPU, compiled on a GPU.

Triton fixes "compiled or interpreted" when a kernel module is imported, so the interpreter flag
must not be set in this process: other tests (and the engine's) would inherit it.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
CASES = Path(__file__).with_name("triton_cases.py")

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("triton") is None, reason="triton is not installed"
    ),
    pytest.mark.integration,  # subprocesses, ~45 s under the interpreter: `make test` runs them
    pytest.mark.parallel_safe,  # CPU work only: two at once in `make test`
]


@pytest.mark.parametrize(
    "group",
    # (each group a subprocess, ~4 s of it the interpreter's start: the small ones share one)
    [
        "decode",
        "extend or non_contiguous or public_api",
        "sliding_window",
        "store_kv or norm or silu",
    ],
)
def test_triton_kernels(group):
    env = {k: v for k, v in os.environ.items() if k != "RADIXRAY_ATTENTION_BACKEND"}
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CASES)]
    cmd += ["-k", group]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} failed:\n{proc.stdout[-6000:]}{proc.stderr[-3000:]}"
    )
    assert " passed" in proc.stdout, proc.stdout[-2000:]
