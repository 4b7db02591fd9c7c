"""SGLang's gateway (``smg``, the release pinned in pyproject) in front of a real ``radixray
worker``: it registers the worker, routes a completion through it, and reads the worker's load
from ``/v1/loads`` (what its overload protection and load-aware policies use)."""

from __future__ import annotations

import time

import httpx
import pytest

from radixray.bench.local_cluster import WorkerSpec, start_smg_router, start_workers
from radixray.bench.peer_smg import smg_available

from ..router.serving import free_port

pytestmark = [pytest.mark.integration]


def test_smg_routes_to_a_worker_and_reads_its_load(tmp_path):
    assert smg_available() is None  # smg is a dev dependency: its absence is a failure here
    spec = WorkerSpec(model="tiny", page_size=16, num_pages=128)
    (worker,) = start_workers(1, free_port(), spec, tmp_path)
    router = None
    try:
        router = start_smg_router(free_port(), [worker.url], "cache_aware", tmp_path, free_port())
        body = {"model": "tiny", "prompt": "hello smg", "max_tokens": 3, "temperature": 0}
        r = httpx.post(router.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 3
        deadline, seen = time.monotonic() + 30, []
        while time.monotonic() < deadline:
            seen = httpx.get(router.url + "/get_loads", timeout=5).json().get("loads", [])
            if seen:
                break
            time.sleep(0.5)
        (rank,) = seen
        assert rank["worker"] == worker.url
        assert rank["max_total_num_tokens"] == 128 * 16  # the worker's pool, as it reported it
        assert rank["max_running_requests"] > 0
    finally:
        for p in (router, worker):
            if p is not None:
                p.stop()
