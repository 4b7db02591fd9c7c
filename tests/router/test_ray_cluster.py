"""Serving through real Ray actors on a real multi-node cluster (``ray.cluster_utils.Cluster``:
a head node and one worker node on this machine), fronted by the real router app."""

from __future__ import annotations

import concurrent.futures as cf
import os
import tempfile

import openai
import pytest

from radixray.model_meta import load_model_meta
from radixray.router.service import RouterService, RouterSettings
from radixray.worker.actor import WorkerActor, worker_actor_options

from .serving import LiveServer, ray_clients

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = pytest.mark.integration  # Ray

# ~580-token shared prefixes: recomputing one costs the tiny model a few ms, clearly more than a
# decode step in flight or a stale load report weighs in ttft's cost (the same test under Serve
# once saw a ~140-token prefix leave its worker)
REPEAT = 32


@pytest.fixture(scope="module")
def cluster():
    os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="rr-ray-"))
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"node_a": 1}})
    c.add_node(num_cpus=1, resources={"node_b": 1})
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


def test_prefixes_concentrate_per_worker_and_spread_over_nodes(cluster):
    handles = {
        wid: WorkerActor.options(
            **worker_actor_options(False, num_cpus=0.5, resources={node: 0.01})
        ).remote({"model": "tiny", "page_size": 4}, wid)
        for wid, node in (("a", "node_a"), ("b", "node_b"))
    }
    infos = {w: ray.get(h.info.remote(), timeout=120) for w, h in handles.items()}
    assert infos["a"].node_id != infos["b"].node_id  # really two nodes

    service = RouterService(
        load_model_meta("tiny"), RouterSettings(policy="ttft", page_size=4, poll_interval_s=0.1)
    )
    with LiveServer(service, lambda: ray_clients(handles)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)

        def ask(prefix: int, q: int) -> tuple[int, str, int]:
            raw = client.completions.with_raw_response.create(
                model="tiny",
                prompt=f"[system prompt {prefix}] " * REPEAT + f"question {q}",
                max_tokens=12,
                temperature=0,
            )
            return (
                prefix,
                raw.headers["x-radixray-worker"],
                raw.parse().usage.prompt_tokens_details.cached_tokens,
            )

        with cf.ThreadPoolExecutor(4) as pool:
            first = list(pool.map(lambda p: ask(p, 0), range(4)))
        later = [ask(p, q) for q in (1, 2) for p in range(4)]
        for h in handles.values():  # no page leaked on either node
            ray.get(h.check_integrity.remote(), timeout=60)
    home = {p: w for p, w, _ in first}
    assert set(home.values()) == {"a", "b"}, home  # distinct prefixes spread over both nodes
    # Every later prompt shares its prefix's prompt up to "question " with the first (one byte
    # a token): those whole pages of 4 are reused, exactly.
    shared = len("[system prompt 0] " * REPEAT + "question ")
    for p, w, cached in later:
        assert w == home[p], (p, w, home)  # each prefix stays where it is cached
        assert cached == shared // 4 * 4, (p, cached)


def test_removing_a_node_under_load(cluster):
    """A node leaves the cluster mid-burst: its worker's unstarted requests complete elsewhere,
    its started streams end with an error event, the router keeps serving."""
    import concurrent.futures as cf
    import time

    import httpx

    from .serving import stream_completion, streaming, wait_for

    node_c = cluster.add_node(num_cpus=1, resources={"node_c": 1})
    cluster.wait_for_nodes()
    handles = {
        wid: WorkerActor.options(
            **worker_actor_options(False, num_cpus=0.5, resources={node: 0.01})
        ).remote({"model": "tiny", "page_size": 4, "cpu_threads": 1}, wid)
        for wid, node in (("a2", "node_a"), ("c2", "node_c"))
    }
    for h in handles.values():
        ray.get(h.info.remote(), timeout=120)
    service = RouterService(
        load_model_meta("tiny"),
        RouterSettings(policy="round_robin", page_size=4, poll_interval_s=0.1),
    )
    with LiveServer(service, lambda: ray_clients(handles)) as url:
        body = {"model": "tiny", "max_tokens": 40, "temperature": 0, "ignore_eos": True}
        removed = {}

        def remove_node():
            workers = service.pool.workers
            wait_for(
                lambda: streaming(workers["a2"]) and streaming(workers["c2"]), "streams on both"
            )
            t0 = time.monotonic()
            cluster.remove_node(node_c)
            # How fast is measured, not asserted (benchmarks/README.md, "Reliability", lists
            # what this prints); the bound only guards against a hang.
            wait_for(lambda: not workers["c2"].healthy, "the router marking c2 down")
            removed["detected"] = time.monotonic() - t0

        with cf.ThreadPoolExecutor(9) as pool:
            rm = pool.submit(remove_node)
            results = list(
                pool.map(
                    lambda i: stream_completion(
                        url, body | {"prompt": f"node {i} " * 3}, timeout=120
                    ),
                    range(30),
                )
            )
            rm.result(timeout=150)  # its own waits fail first, saying what never happened
        broken = [r for r in results if r["error"] is not None]
        assert all(r["status"] == 200 for r in results)
        assert all(r["done"] for r in results if r["error"] is None)
        assert all(r["worker"] == "c2" and r["finish_reason"] is None for r in broken), broken
        assert httpx.get(f"{url}/health").json()["healthy_workers"] == 1
        assert service.index.num_blocks("c2") == 0
        after = stream_completion(url, body | {"prompt": "after the node left"})
        assert after["done"] and after["worker"] == "a2"
        print(
            f"node removal: {len(results) - len(broken)} completed, {len(broken)} started "
            f"streams ended with an error event, detected in {removed['detected'] * 1000:.0f} ms"
        )
