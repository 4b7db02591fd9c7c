"""Worker failure and router replicas on a real local Ray cluster (tiny model).

* Kill one of three worker actors during a burst of 60 streaming requests: requests that had
  not streamed a token complete elsewhere, started streams end with an SSE error event, the
  router keeps serving and the dead worker's index entries are gone.
* Two router processes fed by the same workers' KV events hold the same index.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import subprocess
import sys
import tempfile
import time

import httpx
import pytest

from radixray.deploy.ray_cluster import ACTOR_PREFIX, NAMESPACE
from radixray.model_meta import load_model_meta
from radixray.protocol import PollRequest
from radixray.router.service import RouterService, RouterSettings
from radixray.worker.actor import WorkerActor, worker_actor_options

from .serving import LiveServer, free_port, ray_clients, stream_completion, streaming, wait_for

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.integration  # Ray


@pytest.fixture(scope="module")
def ray_local():
    tmp = tempfile.mkdtemp(prefix="rr-")
    os.environ["RAY_TMPDIR"] = tmp
    ray.init(num_cpus=4, namespace=NAMESPACE, include_dashboard=False, log_to_driver=False)
    yield tmp
    ray.shutdown()


def start_workers(ids, **engine):
    handles = {
        w: WorkerActor.options(
            name=f"{ACTOR_PREFIX}{w}", **worker_actor_options(False, 0.5)
        ).remote({"model": "tiny", "page_size": 4, "cpu_threads": 1} | engine, w)
        for w in ids
    }
    for h in handles.values():
        ray.get(h.info.remote(), timeout=120)
    return handles


def router(**kw) -> RouterService:
    return RouterService(
        load_model_meta("tiny"), RouterSettings(page_size=4, poll_interval_s=0.1, **kw)
    )


def test_kill_one_of_three_workers_during_a_burst(ray_local):
    handles = start_workers(["k0", "k1", "k2"])
    service = router(policy="round_robin")
    victim = "k1"
    with LiveServer(service, lambda: ray_clients(handles)) as url:
        body = {"model": "tiny", "max_tokens": 40, "temperature": 0, "ignore_eos": True}
        jobs = [body | {"prompt": f"burst {i} " * 3} for i in range(60)]
        killed_at = {}

        def killer():
            # Kill once the burst is under way, with streams open on every worker.
            workers = service.pool.workers
            wait_for(lambda: all(streaming(workers[w]) for w in handles), "streams on every worker")
            ray.kill(handles[victim], no_restart=True)
            # How fast is measured, not asserted (benchmarks/README.md, "Reliability", lists
            # what this prints); the bound only guards against a hang.
            killed_at["detected"] = wait_for(
                lambda: not workers[victim].healthy, "the router marking the killed worker down"
            )

        with cf.ThreadPoolExecutor(13) as pool:
            kill = pool.submit(killer)
            results = list(pool.map(lambda b: stream_completion(url, b, timeout=120), jobs))
            kill.result(timeout=150)  # its own waits fail first, saying what never happened
        ok = [r for r in results if r["done"] and r["error"] is None]
        broken = [r for r in results if r["error"] is not None]
        assert len(ok) + len(broken) == 60  # every request ended: none hung, none vanished
        assert all(r["status"] == 200 for r in results)
        # Only streams that had started on the victim may end with an error event...
        assert all(r["worker"] == victim and r["finish_reason"] is None for r in broken), broken
        # ...everything else finished in full, on a live worker or before the kill.
        assert all(len("".join(r["chunks"])) > 0 for r in ok)
        # The router keeps serving; the dead worker is out and its index entries are gone.
        h = httpx.get(f"{url}/health").json()
        assert h["healthy_workers"] == 2 and h["workers"] == 3
        assert service.index.num_blocks(victim) == 0
        for i in range(6):
            r = stream_completion(url, body | {"prompt": f"after {i}"})
            assert r["done"] and r["error"] is None and r["worker"] != victim
        print(
            f"kill: {len(ok)} completed, {len(broken)} started streams ended with an error "
            f"event, detected in {killed_at['detected'] * 1000:.0f} ms"
        )
    for w, hd in handles.items():
        if w != victim:
            ray.kill(hd)


def test_two_router_processes_keep_the_same_index(ray_local):
    handles = start_workers(["j0", "j1"])
    service = router(policy="ttft")
    port_b = free_port()
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_TMPDIR=ray_local)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "radixray.cli",
            "serve",
            "--join",
            "--address",
            ray.get_runtime_context().gcs_address,
            "--model",
            "tiny",
            "--page-size",
            "4",
            "--port",
            str(port_b),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        with LiveServer(service, lambda: ray_clients(handles)) as url_a:
            url_b = f"http://127.0.0.1:{port_b}"
            deadline = time.monotonic() + 120
            while True:
                assert proc.poll() is None, "second router exited"
                try:
                    if httpx.get(f"{url_b}/health", timeout=2).json()["healthy_workers"] == 2:
                        break
                except (httpx.HTTPError, ValueError, KeyError):
                    pass
                assert time.monotonic() < deadline
                time.sleep(0.5)
            for i in range(12):  # traffic through router A only
                r = stream_completion(
                    url_a,
                    {
                        "model": "tiny",
                        "max_tokens": 5,
                        "temperature": 0,
                        "prompt": f"shared system {i % 3} " * 4 + str(i),
                    },
                )
                assert r["done"]
            truth = {}
            for w, h in handles.items():  # the workers' own block sets
                snap = ray.get(h.poll.remote(PollRequest(-1, None)), timeout=30)
                from radixray.cache_index import decode_events

                hashes = [
                    x
                    for ev in decode_events(snap.events).events
                    for x in getattr(ev, "block_hashes", [])
                ]
                truth[w] = f"{len(hashes)}:{sum(hashes) % (1 << 64):016x}"
            deadline = time.monotonic() + 60  # a guard against a hang only
            while True:  # both routers converge on the workers' truth from the same events
                a = {
                    w: v["index_digest"]
                    for w, v in httpx.get(f"{url_a}/debug/cache").json()["workers"].items()
                }
                b = {
                    w: v["index_digest"]
                    for w, v in httpx.get(f"{url_b}/debug/cache").json()["workers"].items()
                }
                if a == b == truth:
                    break
                assert time.monotonic() < deadline, (a, b, truth)
                time.sleep(0.2)
            assert any(not d.startswith("0:") for d in truth.values())  # not trivially equal
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        for h in handles.values():
            ray.kill(h)
