"""The Serve application end to end: deploy ``deploy/serve_config.yaml``'s app on a local Ray,
talk to it with the official ``openai`` client over HTTP, check that shared prefixes stay on
the replica that caches them, shut Serve and Ray down."""

from __future__ import annotations

import concurrent.futures as cf
import os
import socket
import tempfile
import time
from pathlib import Path

import httpx
import openai
import pytest
import yaml

ray = pytest.importorskip("ray")
from ray import serve  # noqa: E402

from radixray.deploy.serve import WORKER_DEPLOYMENT, build_app  # noqa: E402

pytestmark = pytest.mark.integration  # Serve

ROOT = Path(__file__).resolve().parents[2]
APP = "radixray"


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture(scope="module")
def app_url():
    config = yaml.safe_load((ROOT / "deploy/serve_config.yaml").read_text())
    (spec,) = config["applications"]
    assert spec["import_path"] == "radixray.deploy.serve:build_app"
    os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="rr-serve-"))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(spec["args"]), name=APP, route_prefix=spec["route_prefix"])
        yield f"http://127.0.0.1:{port}", spec["args"]
    finally:
        serve.shutdown()
        ray.shutdown()


# Shared prefixes of ~580 tokens: recomputing one costs a few ms on the tiny model, well above
# what a stale load report or a decode step in flight can weigh in ttft's cost (with 8 repeats,
# ~140 tokens, a request once left its prefix's worker on CI).
REPEAT = 32


def _asker(url: str):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)

    def ask(prefix: int, q: int) -> tuple[int, str, int]:
        raw = client.completions.with_raw_response.create(
            model="tiny",
            prompt=f"[system prompt {prefix}] " * REPEAT + f"question {q}",
            max_tokens=8,
            temperature=0,
        )
        return (
            prefix,
            raw.headers["x-radixray-worker"],
            raw.parse().usage.prompt_tokens_details.cached_tokens,
        )

    return client, ask


def _wait_until_reported_idle(url: str, timeout: float = 60) -> None:
    """Until the router's latest load report of every worker (its /metrics) shows nothing
    running or waiting; ``timeout`` only guards against a hang."""
    from prometheus_client.parser import text_string_to_metric_families

    deadline = time.monotonic() + timeout
    while True:
        text = httpx.get(f"{url}/metrics", timeout=30).text
        load = {
            (s.labels["worker"], s.labels["field"]): s.value
            for f in text_string_to_metric_families(text)
            if f.name == "radixray_worker_load"
            for s in f.samples
            if s.labels["field"] in ("running", "waiting")
        }
        if load and not any(load.values()):
            return
        assert time.monotonic() < deadline, f"the workers' reports never showed them idle: {load}"
        time.sleep(0.05)


def test_openai_requests_and_prefix_affinity_under_serve(app_url):
    url, args = app_url
    health = httpx.get(f"{url}/health", timeout=30).json()
    assert health["status"] == "ok" and health["healthy_workers"] == 2, health

    client, ask = _asker(url)
    assert [m.id for m in client.models.list().data] == ["tiny"]

    with cf.ThreadPoolExecutor(4) as pool:
        first = list(pool.map(lambda p: ask(p, 0), range(4)))
    later = []
    for q in (1, 2):
        for p in range(4):
            # One at a time, on a fleet the router sees idle again: the affinity under test is
            # where ttft sends a prefix when nothing else is running (back to back, the last
            # request's worker may still look busy in its latest report, and moving is right).
            _wait_until_reported_idle(url)
            later.append(ask(p, q))
    home = {p: w for p, w, _ in first}
    assert len(set(home.values())) == 2, home  # distinct prefixes spread over both replicas
    page = args["page_size"]
    moved = [(p, w) for p, w, _ in later if w != home[p]]
    if moved:  # each prefix stays on the replica that caches it; if not, show why
        log = httpx.get(f"{url}/debug/decisions?limit=100", timeout=30).json()["decisions"]
        raise AssertionError(f"moved off their home {home}: {moved}; decisions: {log}")
    # Every later prompt shares its prefix's first prompt up to "question " (one byte a token):
    # those whole pages are reused, exactly.
    shared = len("[system prompt 0] " * REPEAT + "question ")
    for p, _, cached in later:
        assert cached == shared // page * page, (p, cached)

    # Streaming chat through the Serve proxy, and the decision log of the same router.
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=6,
        temperature=0,
        stream=True,
    )
    chunks = list(stream)
    assert chunks and chunks[-1].choices[0].finish_reason in ("stop", "length")
    decisions = httpx.get(f"{url}/debug/decisions?limit=100", timeout=30).json()
    assert decisions["policy"] == args["policy"]
    assert {d["worker_id"] for d in decisions["decisions"]} == set(home.values())

    # Pinned calls from another process (this driver) reach the named replica, and no replica
    # leaked a page.
    workers = serve.get_deployment_handle(WORKER_DEPLOYMENT, app_name=APP)
    for wid in set(home.values()):
        pages = workers.check_integrity.remote(replica=wid).result(timeout_s=60)
        assert pages["running"] == pages["waiting"] == 0 and pages["free_pages"] > 0, (wid, pages)


def test_a_killed_worker_replica_is_routed_around_and_replaced(app_url):
    url, _ = app_url
    _, ask = _asker(url)
    _, victim, _ = ask(7, 0)
    # The replica actor's name as Serve documents it for fault-injection: SERVE_REPLICA::app#dep#id
    actor = ray.get_actor(f"SERVE_REPLICA::{APP}#{WORKER_DEPLOYMENT}#{victim}", namespace="serve")
    ray.kill(actor, no_restart=True)
    # The prefix's home is gone: its requests are retried on (then stay with) the survivor.
    served = {ask(7, q)[1] for q in range(1, 4)}
    assert victim not in served and len(served) == 1, (victim, served)

    # Serve starts a replacement replica; the router drains the dead one and adds the new one.
    deadline = time.monotonic() + 60
    while True:
        workers = httpx.get(f"{url}/debug/cache", timeout=30).json()["workers"]
        if victim not in workers and len(workers) == 2:
            break
        assert time.monotonic() < deadline, workers
        time.sleep(0.5)
    assert all(w["healthy"] for w in workers.values()), workers
    with cf.ThreadPoolExecutor(4) as pool:
        spread = {w for _, w, _ in pool.map(lambda p: ask(100 + p, 0), range(4))}
    assert spread == set(workers), (spread, set(workers))  # the new replica takes traffic
