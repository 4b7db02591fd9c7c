"""Several routers (RouterServices, each with its own pool, index and policy) over the same real
in-process workers: what `radixray serve --join` replicas or Serve ingress replicas are, in one
process. Used by the fleet tests and by the burst study (`benchmarks/studies/bench_burst.py`)."""

from __future__ import annotations

import asyncio
import contextlib

from radixray.model_meta import load_model_meta
from radixray.protocol import LocalTransport, WorkerClient
from radixray.router.service import RouterService, RouterSettings
from radixray.worker import WorkerHost

__all__ = ["drain", "fleet", "hosts_for", "join", "until"]


def hosts_for(n: int, **engine) -> list[WorkerHost]:
    """``n`` tiny-model workers ``w0``..``w{n-1}`` (engine settings override the defaults)."""
    cfg = {"model": "tiny", "page_size": 16, "num_pages": 1024, "cpu_threads": 1} | engine
    return [WorkerHost(cfg, f"w{i}") for i in range(n)]


@contextlib.asynccontextmanager
async def fleet(hosts: list[WorkerHost], n_routers: int, **settings):
    """``n_routers`` started RouterServices over ``hosts`` (the hosts stay up after)."""
    settings = {"page_size": 16, "poll_interval_s": 0.05} | settings
    services = [
        RouterService(load_model_meta("tiny"), RouterSettings(router_id=f"r{i}", **settings))
        for i in range(n_routers)
    ]
    try:
        for s in services:
            await join(s, hosts)
        yield services
    finally:
        for s in services:
            await s.stop()


async def join(service: RouterService, hosts: list[WorkerHost]) -> None:
    """Add every host to ``service`` (in process; the hosts are not the service's to close)."""
    for h in hosts:
        await service.add_worker(WorkerClient(LocalTransport(h, owner=False), h.worker_id))
    await service.start()


async def until(predicate, timeout_s: float = 10.0, what: str = "condition") -> None:
    """Wait until ``predicate()`` holds (polled every 20 ms); ``AssertionError`` at the timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def drain(stream) -> str:
    """Read a routed stream to its end; returns the worker that served it."""
    async for _ in stream:
        pass
    await stream.aclose()
    return stream.worker_id
