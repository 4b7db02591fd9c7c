"""`radixray serve` as a user runs it: real Ray, two workers, the embedded SmolLM2, the official
openai client; then SIGTERM shuts everything down."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import httpx
import openai
import pytest

from tests.router.serving import free_port

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_serve_answers_a_chat_sensibly(tmp_path):
    port = free_port()
    # Ray's socket paths must stay under 107 bytes: a short temp dir, not pytest's deep one.
    ray_tmp = tempfile.mkdtemp(prefix="rr-")
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_TMPDIR=ray_tmp)
    log = open(tmp_path / "serve.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "radixray.cli",
            "serve",
            "--workers",
            "2",
            "--model",
            "smollm2",
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--num-pages",
            "512",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 400
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                h = httpx.get(f"{url}/health", timeout=2).json()
                if h["healthy_workers"] == 2:
                    break
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            assert time.monotonic() < deadline, "radixray serve did not become ready"
            time.sleep(1)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
        r = client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=20,
            temperature=0,
        )
        assert "Paris" in r.choices[0].message.content
        assert r.usage.prompt_tokens > 10 and r.usage.completion_tokens > 0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode is not None
