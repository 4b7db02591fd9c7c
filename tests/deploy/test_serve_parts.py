"""The Serve app's parts without Ray: config validation, the pinned request router's choice,
membership following the replica set."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from radixray.deploy import replicas
from radixray.deploy.membership import ReplicaMembership
from radixray.deploy.replica_router import PinnedReplicaRouter
from radixray.deploy.serve_config import ServeAppConfig


def test_config_from_dict_and_deployment_options(monkeypatch):
    monkeypatch.setenv("RADIXRAY_ADMIN_TOKEN", "s3cret")
    cfg = ServeAppConfig.from_dict(
        {
            "model": "tiny",
            "policy": "cache_aware",
            "page_size": 8,
            "engine": {"num_pages": 64},
            "router": {"settings": {"poll_interval_s": 0.1}},
            "workers": {
                "num_gpus": 1,
                "autoscaling_config": {"min_replicas": 1, "max_replicas": 3},
            },
        }
    )
    assert cfg.engine_config("w1") == {
        "num_pages": 64,
        "model": "tiny",
        "page_size": 8,
        "worker_id": "w1",
    }
    s = cfg.router_settings()
    assert (s.policy, s.page_size, s.admin_token, s.poll_interval_s) == (
        "cache_aware",
        8,
        "s3cret",
        0.1,
    )
    w = cfg.workers.deployment_options()
    assert w["ray_actor_options"] == {"num_cpus": 0.5, "num_gpus": 1}
    assert w["autoscaling_config"]["max_replicas"] == 3 and "num_replicas" not in w
    assert cfg.workers.initial_replicas == 1
    assert ServeAppConfig.from_dict({"model": "tiny"}).workers.initial_replicas == 2
    assert cfg.router.deployment_options()["ray_actor_options"] == {"num_cpus": 0}
    assert cfg.router.deployment_options()["num_replicas"] == 1
    scaled = ServeAppConfig.from_dict(
        {"model": "tiny", "router": {"autoscaling_config": {"min_replicas": 2, "max_replicas": 4}}}
    ).router.deployment_options()
    assert scaled["autoscaling_config"]["max_replicas"] == 4 and "num_replicas" not in scaled


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"modle": "tiny"}, "unknown key"),
        ({"policy": "fastest"}, "unknown routing policy"),
        ({"page_size": 12}, "page_size"),
        ({"engine": {"page_size": 8}}, "engine.page_size is set by the app"),
        ({"engine": {"num_pagez": 8}}, "num_pagez"),
        ({"router": {"settings": {"admin_token": "x"}}}, "RADIXRAY_ADMIN_TOKEN"),
        ({"router": {"settings": {"max_inflight": 0}}}, "max_inflight"),
        ({"workers": {"num_replicas": 0}}, "workers.num_replicas"),
        ({"workers": {"num_cpus": -1}}, "workers.num_cpus"),
        ({"workers": {"autoscaling_config": {"min_replicas": 0}}}, "min_replicas must be >= 1"),
        ({"router": {"autoscaling_config": {"min_replicas": 0}}}, "router.autoscaling_config"),
    ],
)
def test_config_rejects_bad_values_naming_them(data, message):
    with pytest.raises((ValueError, TypeError), match=message):
        ServeAppConfig.from_dict({"model": "tiny", **data})


def _replica(uid: str):
    return SimpleNamespace(replica_id=SimpleNamespace(unique_id=uid))


def _pending(**kwargs):
    loop = asyncio.get_running_loop()
    return SimpleNamespace(
        kwargs=kwargs,
        routing_context=SimpleNamespace(should_backoff=False),
        future=loop.create_future(),
        metadata=SimpleNamespace(internal_request_id=f"req-{kwargs}", multiplexed_model_id=""),
    )


async def test_pinned_router_returns_exactly_the_target_or_fails_fast():
    router = object.__new__(PinnedReplicaRouter)  # choose_replicas uses no Serve state
    reps = [_replica("a"), _replica("b"), _replica("c")]
    req = _pending(replica="b")
    assert await router.choose_replicas(reps, req) == [[reps[1]]]
    assert req.routing_context.should_backoff and not req.future.done()

    gone = _pending(replica="z")
    router._pending_requests_by_id = {gone.metadata.internal_request_id: gone}
    ranks = await router.choose_replicas(reps, gone)
    assert router._pending_requests_by_id == {}  # a failed request is not left indexed
    assert len(ranks) == 1 and len(ranks[0]) == 1  # non-empty: Serve's loop sees the failure
    with pytest.raises(replicas.ReplicaGone, match="'z'"):
        gone.future.result()

    assert await router.choose_replicas(reps, _pending()) == [reps]  # unpinned: any replica


class _FakeService:
    def __init__(self):
        self.pool = SimpleNamespace(workers={})
        self.drained: list[str] = []

    async def add_worker(self, client):
        if client == "bad":
            raise ValueError("page size mismatch")
        self.pool.workers[client] = SimpleNamespace(draining=False)

    def start_drain(self, wid):
        self.drained.append(wid)
        self.pool.workers[wid].draining = True


async def _adds_done(m: ReplicaMembership, timeout: float = 30) -> None:
    """Until the adds a sync started have finished (``timeout``: a guard against a hang)."""
    deadline = time.monotonic() + timeout
    while m._adding:
        assert time.monotonic() < deadline, f"adds still running: {sorted(m._adding)}"
        await asyncio.sleep(0.001)


async def test_membership_adds_new_replicas_and_drains_departed_ones():
    svc = _FakeService()
    running = {"ids": None}
    m = ReplicaMembership(svc, lambda: running["ids"], lambda rid: rid, interval_s=0.01)
    await m.sync_once()  # nothing known yet
    assert svc.pool.workers == {}
    running["ids"] = frozenset({"a", "b"})
    assert await m.wait_for_workers(2, timeout_s=5) == 2
    running["ids"] = frozenset({"b", "c"})
    await m.sync_once()
    await _adds_done(m)
    assert svc.drained == ["a"] and set(svc.pool.workers) == {"a", "b", "c"}
    # An operator removed "b" through /admin: it is not re-added while Serve still lists it.
    del svc.pool.workers["b"]
    await m.sync_once()
    await _adds_done(m)
    assert "b" not in svc.pool.workers
    # A replica that failed to register is retried on a later round.
    running["ids"] = frozenset({"c", "bad"})
    await m.sync_once()
    await _adds_done(m)
    assert "bad" not in m._seen
    await m.stop()
