"""A worker actor's own HTTP server: built by the actor's class (``HttpWorkerHost.start_http``,
over the one uvicorn starter), not by ``WorkerHost``; the router reaches it as
``radixray serve`` does (``deploy.ray_cluster.actor_client``)."""

from __future__ import annotations

import os
import tempfile

import httpx
import pytest

from radixray.protocol import GenerateRequest, SamplingParams
from radixray.worker.actor import HttpWorkerHost
from radixray.worker.host import WorkerHost

CONFIG = {"model": "tiny", "page_size": 16, "num_pages": 64}


def test_the_host_builds_no_http_server():
    assert not hasattr(WorkerHost, "start_http")


async def test_the_actor_class_serves_its_host_over_http():
    host = HttpWorkerHost(CONFIG, "w-http")
    try:
        url = await host.start_http("127.0.0.1", 0, token="s3cret")
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0")
        assert await host.start_http("127.0.0.1", 0, token="s3cret") == url  # idempotent
        assert (await host.info()).http_url == url
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            assert (await c.get("/health")).json() == {"status": "ok"}
            r = await c.post("/internal/info", content=b"")
            assert r.status_code == 401  # the internal routes are behind the token
            body = {"model": "tiny", "prompt": "abc", "max_tokens": 3}
            r = await c.post("/v1/completions", json=body)
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    finally:
        host.shutdown()


@pytest.mark.integration  # Ray
async def test_a_ray_worker_actor_is_reached_over_its_own_http_server():
    ray = pytest.importorskip("ray")
    from radixray.deploy.ray_cluster import actor_client
    from radixray.worker.actor import WorkerActor, worker_actor_options

    os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="rr-ray-"))
    ray.init(num_cpus=1, log_to_driver=False, include_dashboard=False)
    try:
        handle = WorkerActor.options(**worker_actor_options(False)).remote(CONFIG, "w-ray")
        client = await actor_client(handle, "w-ray", "http", "t0ken", owned=True)
        try:
            info = await client.info()
            assert info.worker_id == "w-ray" and info.http_url.startswith("http://")
            params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
            chunks = [c async for c in client.generate(GenerateRequest("r1", [1, 2, 3], params))]
            assert chunks[-1].final and chunks[-1].completion_tokens == 3
        finally:
            await client.close()  # owned: kills the actor
    finally:
        ray.shutdown()
