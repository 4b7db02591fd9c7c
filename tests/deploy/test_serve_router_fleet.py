"""Two router replicas under Ray Serve over the same two worker replicas: both warm, /metrics of
whichever one the proxy picks covers the fleet, and a router replica killed mid-run loses no
request that had not started streaming (Serve's proxy sends it to the other, or the client gets
a clear error it can retry), then Serve replaces it."""

from __future__ import annotations

import concurrent.futures as cf
import os
import socket
import tempfile
import time

import httpx
import pytest

ray = pytest.importorskip("ray")
from ray import serve  # noqa: E402

from radixray.deploy.serve import ROUTER_DEPLOYMENT, build_app  # noqa: E402

pytestmark = pytest.mark.integration  # Serve

APP = "radixray-fleet"
ARGS = {
    "model": "tiny",
    "policy": "ttft",
    "page_size": 16,
    "engine": {"device": "cpu", "cpu_threads": 1, "num_pages": 512},
    "router": {"num_replicas": 2, "num_cpus": 0, "settings": {"poll_interval_s": 0.1}},
    "workers": {"num_replicas": 2, "num_cpus": 0.5},
}


@pytest.fixture(scope="module")
def fleet_url():
    os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="rr-sf-"))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(ARGS), name=APP, route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def _routers(url: str, tries: int = 40) -> dict[str, dict]:
    """The router replicas the proxy reaches, by router id (their /health bodies)."""
    seen = {}
    with httpx.Client(timeout=30) as c:
        for _ in range(tries):
            r = c.get(f"{url}/health")
            if r.status_code == 200:
                seen[r.json()["router_id"]] = r.json()
    return seen


def _ask(url: str, i: int) -> tuple[int, dict | None]:
    body = {"model": "tiny", "prompt": f"fleet request {i} " * 4, "max_tokens": 4}
    try:
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    except httpx.HTTPError as e:  # the connection itself failed: the client retries
        return -1, {"error": repr(e)}
    return r.status_code, r.json() if r.headers.get("content-type", "").startswith(
        "application/json"
    ) else {"raw": r.text[:200]}


def test_both_routers_are_warm_and_metrics_cover_the_fleet(fleet_url):
    routers = _routers(fleet_url)
    assert len(routers) == 2, routers
    for body in routers.values():
        assert body["status"] == "ok" and body["healthy_workers"] == 2 and body["routers"] == 2
    for i in range(8):
        assert _ask(fleet_url, i)[0] == 200
    deadline = time.monotonic() + 30
    while True:  # each replica publishes every 2 s; any scrape shows both, and all 8 requests
        text = httpx.get(f"{fleet_url}/metrics", timeout=30).text
        fleet_lines = [line for line in text.splitlines() if line.startswith("radixray_fleet_")]
        routers_line = next(x for x in fleet_lines if x.startswith("radixray_fleet_routers "))
        decided = sum(
            float(x.rsplit(" ", 1)[1])
            for x in fleet_lines
            if x.startswith("radixray_fleet_decisions_total{")
        )
        if routers_line.endswith(" 2") and decided >= 8:
            break
        assert time.monotonic() < deadline, fleet_lines
        time.sleep(0.5)


def test_a_killed_router_replica_loses_no_request(fleet_url):
    victim_id = next(iter(_routers(fleet_url)))
    actor = ray.get_actor(
        f"SERVE_REPLICA::{APP}#{ROUTER_DEPLOYMENT}#{victim_id}", namespace="serve"
    )
    with cf.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(_ask, fleet_url, 100 + i) for i in range(8)]
        ray.kill(actor, no_restart=True)
        futures += [pool.submit(_ask, fleet_url, 200 + i) for i in range(24)]
        results = [f.result(timeout=120) for f in futures]
    # Served, or refused with a clear error the client can retry: never a hang, never a 200
    # without its answer.
    for status, body in results:
        if status == 200:
            assert body["choices"][0]["finish_reason"] == "length", body
        else:
            assert status in (-1, 500, 502, 503), (status, body)
    served = sum(status == 200 for status, _ in results)
    print("statuses after the kill:", sorted(status for status, _ in results))
    assert served >= len(results) - 8, results  # at most the ones in flight on the victim
    # Serve replaces the replica; the new one joins warm and the fleet serves everything.
    deadline = time.monotonic() + 90
    while True:
        routers = _routers(fleet_url, tries=20)
        if len(routers) == 2 and victim_id not in routers:
            break
        assert time.monotonic() < deadline, routers
        time.sleep(1)
    assert all(_ask(fleet_url, 300 + i)[0] == 200 for i in range(8))
