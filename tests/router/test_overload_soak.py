"""Overload, client disconnects and a soak run through the real router and real in-process
workers (tiny model). The workers must end with every page accounted for."""

from __future__ import annotations

import concurrent.futures as cf
import random
import time

import httpx
import pytest

from .serving import LiveServer, inprocess_service, stream_completion

pytestmark = pytest.mark.integration  # soak


def settle(hosts, timeout: float = 30, service=None) -> None:
    """Wait until the router has nothing in flight and the workers nothing running or waiting,
    then prove no page leaked."""
    deadline = time.monotonic() + timeout
    while (service is not None and service.inflight) or any(
        h.engine.stats()["running"] or h.engine.stats()["waiting"] for h in hosts
    ):
        assert time.monotonic() < deadline, [h.engine.stats() for h in hosts]
        time.sleep(0.05)
    for h in hosts:
        h.engine.check_integrity()
        s = h.engine.stats()
        assert h.engine.cache.protected_tokens == 0
        assert s["free_pages"] + s["cached_pages"] == s["total_pages"]


def test_overload_answers_429_with_retry_after_and_accepted_requests_finish():
    service, hosts, clients = inprocess_service(2, max_inflight=4, retry_after_s=2)
    body = {
        "model": "tiny",
        "prompt": "overload " * 4,
        "max_tokens": 40,
        "temperature": 0,
        "ignore_eos": True,
    }
    with LiveServer(service, clients) as url, cf.ThreadPoolExecutor(20) as pool:
        rs = list(
            pool.map(
                lambda _: httpx.post(f"{url}/v1/completions", json=body, timeout=120), range(40)
            )
        )
        statuses = [r.status_code for r in rs]
        assert set(statuses) <= {200, 429}, statuses
        assert statuses.count(429) > 0 and statuses.count(200) >= 4
        for r in rs:
            if r.status_code == 429:
                assert r.headers["retry-after"] == "2"
                assert r.json()["error"]["type"] == "rate_limit_error"
            else:
                assert r.json()["usage"]["completion_tokens"] == 40
        assert service.inflight == 0
        settle(hosts, service=service)
    for h in hosts:
        h.shutdown()


def test_client_disconnect_aborts_on_the_worker():
    service, hosts, clients = inprocess_service(1)
    with LiveServer(service, clients) as url:
        body = {
            "model": "tiny",
            "prompt": "go on and on",
            "max_tokens": 3000,
            "temperature": 0,
            "ignore_eos": True,
        }
        r = stream_completion(url, body, stop_after=2)
        assert r["status"] == 200 and len(r["chunks"]) == 2 and not r["done"]
        # The 3000-token request was aborted, not left running.
        settle(hosts, timeout=10, service=service)
        assert hosts[0].engine.stats()["requests_aborted"] == 1
        # A non-streaming client that times out is aborted too.
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{url}/v1/completions", json=body | {"max_tokens": 4000}, timeout=0.3)
        settle(hosts, timeout=10, service=service)
        assert hosts[0].engine.stats()["requests_aborted"] == 2
        assert service.inflight == 0
    hosts[0].shutdown()


SOAK_REQUESTS = 1200  # each adds a page of its own: six times the two pools' 192 pages


def test_soak_requests_with_aborts_and_disconnects():
    rng = random.Random(0)
    service, hosts, clients = inprocess_service(2, engine={"num_pages": 192})
    systems = [f"system prompt number {i}. " * rng.randint(1, 4) for i in range(6)]
    jobs = []
    for i in range(SOAK_REQUESTS):
        kind = rng.random()
        body = {
            "model": "tiny",
            "prompt": rng.choice(systems) + f"q{i}",
            "max_tokens": rng.randint(1, 6),
            "temperature": rng.choice([0, 0.7]),
        }
        jobs.append(("disconnect" if kind < 0.1 else "stream" if kind < 0.3 else "plain", body))

    def run(job):
        kind, body = job
        if kind == "plain":
            return httpx.post(f"{url}/v1/completions", json=body, timeout=120).status_code
        r = stream_completion(url, body, stop_after=1 if kind == "disconnect" else None)
        return r["status"] if (r["done"] or kind == "disconnect") else 599

    with LiveServer(service, clients) as url, cf.ThreadPoolExecutor(16) as pool:
        t0 = time.monotonic()
        statuses = list(pool.map(run, jobs))
        elapsed = time.monotonic() - t0
        assert statuses.count(200) == SOAK_REQUESTS, {s: statuses.count(s) for s in set(statuses)}
        settle(hosts, service=service)
        evictions = sum(h.engine.stats()["evicted_pages"] for h in hosts)
    print(f"soak: {SOAK_REQUESTS} requests in {elapsed:.1f}s, {evictions} pages evicted")
    assert evictions > 0  # the pool was small enough that the cache churned
    for h in hosts:
        h.shutdown()
