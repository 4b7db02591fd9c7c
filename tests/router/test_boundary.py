"""The router side of the boundary: a router process never loads torch or the worker package,
and two workers claiming one id stop a router at start-up with a clear message."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from radixray.cache_index import ApproxIndex
from radixray.protocol import WorkerClient
from radixray.protocol.http_transport import HttpTransport
from radixray.router.worker_pool import DuplicateWorker, WorkerPool

from .serving import free_port, worker_server

pytestmark = pytest.mark.integration  # subprocesses

# Runs in a fresh interpreter: builds the router app, serves one completion through it (to a
# real worker over HTTP) and reports which modules it loaded.
ROUTER_ONLY = r"""
import asyncio, json, sys
import httpx
from radixray.model_meta import load_model_meta
from radixray.protocol import WorkerClient
from radixray.protocol.http_transport import HttpTransport
from radixray.router.app import build_app
from radixray.router.service import RouterService, RouterSettings

async def main(url):
    service = RouterService(load_model_meta("tiny"), RouterSettings(page_size=16))
    await service.add_worker(await WorkerClient.connect(HttpTransport(url)))
    app = build_app(service, manage_lifecycle=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://r") as c:
        body = {"model": "tiny", "prompt": "across the boundary", "max_tokens": 3}
        r = await c.post("/v1/completions", json=body)
        structured = body | {"max_tokens": 40, "response_format": {"type": "json_schema",
            "json_schema": {"name": "x", "schema": {"enum": ["yes", "no"]}}}}
        rs = await c.post("/v1/completions", json=structured)
    numpy_for_tiny = "numpy" in sys.modules  # a tiny-model router needs no numpy (~11 MB RSS)
    load_model_meta("smollm2")  # a real tokenizer and chat template, from the GGUF metadata
    await service.close()
    heavy = ("torch", "radixray.worker", "llguidance", "xgrammar")
    loaded = sorted(m for m in sys.modules if m.split(".")[0] == "torch" or m.startswith(heavy))
    print(json.dumps({"status": r.status_code, "body": r.json(), "loaded": loaded,
                      "structured": rs.json(),
                      "numpy_for_tiny": numpy_for_tiny}))

asyncio.run(main(sys.argv[1]))
"""


def test_a_router_process_never_loads_torch_or_the_worker(tmp_path):
    server, host = worker_server("bw0")
    try:
        with server as url:
            script = tmp_path / "router_only.py"
            script.write_text(ROUTER_ONLY)
            out = subprocess.run(
                [sys.executable, str(script), url],
                capture_output=True,
                text=True,
                timeout=120,
                cwd=os.getcwd(),
            )
    finally:
        host.shutdown()
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["status"] == 200, result
    assert result["body"]["usage"]["completion_tokens"] == 3
    assert json.loads(result["structured"]["choices"][0]["text"]) in ("yes", "no")
    assert result["loaded"] == []  # no torch, no radixray.worker, no grammar library
    assert result["numpy_for_tiny"] is False


def test_two_workers_claiming_one_id_is_a_clear_error():
    servers = [worker_server("same") for _ in range(2)]
    try:
        with servers[0][0] as url_a, servers[1][0] as url_b:
            # The pool refuses the second, naming both addresses.
            async def add_both():
                pool = WorkerPool(ApproxIndex(16))
                for u in (url_a, url_b):
                    await pool.add(await WorkerClient.connect(HttpTransport(u)))

            with pytest.raises(DuplicateWorker) as err:
                asyncio.run(add_both())
            assert "'same'" in str(err.value)
            assert url_a in str(err.value) and url_b in str(err.value)
            # `radixray serve` in front of them stops at start-up with that message, no traceback.
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "radixray.cli",
                    "serve",
                    "--model",
                    "tiny",
                    "--page-size",
                    "16",
                    "--port",
                    str(free_port()),
                    "--worker-urls",
                    url_a,
                    url_b,
                ],
                capture_output=True,
                text=True,
                timeout=120,
            )
    finally:
        for _, host in servers:
            host.shutdown()
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "two workers claim the worker id 'same'" in text, text[-2000:]
    assert url_a in text and url_b in text and "--worker-id" in text
    assert "Traceback" not in text


def test_default_worker_ids_are_unique():
    from radixray.worker import WorkerHost

    hosts = [WorkerHost({"model": "tiny", "page_size": 16, "num_pages": 16}) for _ in range(2)]
    try:
        assert hosts[0].worker_id != hosts[1].worker_id
        assert all(h.worker_id == h.address for h in hosts)
    finally:
        for h in hosts:
            h.shutdown()
