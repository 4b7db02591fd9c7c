"""The router service: model metadata, the worker pool, the router, metrics and limits in one
object that the HTTP routes depend on. Built once per process (``radixray serve``, the Ray Serve
ingress, tests). It is the OpenAI edge's backend (``radixray.api.Backend``): ``open`` admits a
request (or refuses it, overloaded) and routes it (``request_path.py``)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from radixray.api.response_store import ResponseStoreConfig
from radixray.cache_index import ApproxIndex
from radixray.model_meta import ModelMeta
from radixray.protocol import GenerateRequest, Overloaded, WorkerClient

from .fleet_metrics import FleetMetrics, KVStore
from .policies import Policy, make_policy
from .prometheus_metrics import RouterMetrics
from .request_path import RoutedRequest, Router
from .worker_pool import WorkerPool

__all__ = ["RouterSettings", "RouterService", "Overloaded"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RouterSettings:
    policy: str = "ttft"
    page_size: int = 16
    admin_token: str | None = None  # None: the admin routes are off
    enable_debug: bool = True
    max_body_bytes: int = 4 << 20
    max_tokens_limit: int = 4096  # largest max_tokens a request may ask for
    max_inflight: int = 1024  # accepted requests in flight across all workers
    max_inflight_per_worker: int = 256
    # Refuse (429) a request that would wait longer than this before its prefill on the
    # least-queued worker, at the workers' measured prefill rates (router/admission.py); None:
    # no delay limit, only the counts above.
    max_queue_s: float | None = 30.0
    retry_after_s: int = 1  # the least Retry-After a 429 / 503 names
    poll_interval_s: float = 0.25
    max_index_blocks_per_worker: int = 1 << 20
    max_retries: int = 2
    seed: int = 0
    # How this router names itself (to the workers it polls, in its decisions and metrics);
    # None: unique in its process (host, pid and a counter). `radixray serve` and the Serve
    # ingress set it.
    router_id: str | None = None
    herd_window: int = 64  # decisions the herding alarm looks back over
    # Stored responses of /v1/responses (radixray/api/response_store.py): how many, how long.
    responses: ResponseStoreConfig = field(default_factory=ResponseStoreConfig)

    def __post_init__(self):
        for name in (
            "max_body_bytes",
            "max_inflight",
            "max_inflight_per_worker",
            "max_index_blocks_per_worker",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"RouterSettings.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_queue_s is not None and not self.max_queue_s > 0:
            raise ValueError(
                f"RouterSettings.max_queue_s must be > 0 seconds or None (no limit), got "
                f"{self.max_queue_s}"
            )


WorkerFactory = Callable[[dict], Awaitable[WorkerClient]]
_services_in_process = itertools.count()


def _default_router_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{next(_services_in_process)}"


class RouterService:
    def __init__(
        self,
        meta: ModelMeta,
        settings: RouterSettings | None = None,
        policy: Policy | None = None,
        worker_factory: WorkerFactory | None = None,
    ):
        self.meta = meta
        self.settings = settings = settings or RouterSettings()
        self.router_id = settings.router_id or _default_router_id()
        self.index = ApproxIndex(settings.page_size, settings.max_index_blocks_per_worker)
        self.pool = WorkerPool(self.index, settings.poll_interval_s, router_id=self.router_id)
        self.policy = policy or make_policy(settings.policy, seed=settings.seed)
        self.router = Router(
            self.pool,
            self.policy,
            self.index,
            max_retries=settings.max_retries,
            max_inflight_per_worker=settings.max_inflight_per_worker,
            router_id=self.router_id,
            herd_window=settings.herd_window,
            max_inflight=settings.max_inflight,
            max_queue_s=settings.max_queue_s,
            retry_after_s=settings.retry_after_s,
        )
        self.metrics = RouterMetrics(self.router_id)
        self.fleet_metrics: FleetMetrics | None = None  # set where routers share a store (Ray)
        self.router.dispatch.listeners.append(self.metrics.on_decision)
        self.worker_factory = worker_factory
        self._drains: set[asyncio.Task] = set()

    @property
    def model_name(self) -> str:
        return self.meta.name

    @property
    def max_tokens_limit(self) -> int:
        return self.settings.max_tokens_limit

    @property
    def retry_after_s(self) -> int:
        return self.settings.retry_after_s

    async def open(
        self, req: GenerateRequest, session_key: str | None = None, cache_key: str | None = None
    ) -> RoutedRequest:
        """Admit and route ``req`` (``request_path.py``); its admission slot is released when
        it ends."""
        return await self.router.open(req, session_key, cache_key)

    @property
    def inflight(self) -> int:
        """Requests admitted and not yet ended."""
        return self.router.admission.inflight

    def share_metrics(self, store: KVStore) -> None:
        """Publish this router's counters to ``store`` and show the fleet's on /metrics."""
        self.fleet_metrics = FleetMetrics(self.metrics.registry, self.router_id, store)

    async def start(self) -> None:
        self.pool.start()
        if self.fleet_metrics is not None:
            self.fleet_metrics.start()

    async def stop(self) -> None:
        await self.pool.stop()
        if self.fleet_metrics is not None:
            await self.fleet_metrics.stop()

    async def render_metrics(self) -> bytes:
        self.metrics.refresh(self.pool)
        self.metrics.refresh_herding(self.router.dispatch.herd, self.pool.workers)
        self.metrics.refresh_headroom(self.router.policy)
        self.metrics.refresh_admission(self.router.admission, self.pool.queue_wait_s())
        text = self.metrics.render()
        if self.fleet_metrics is not None:
            try:
                text += await asyncio.to_thread(self.fleet_metrics.render)
            except Exception:  # the store is unreachable: this router's own counters still
                log.exception("fleet metrics: reading the fleet's counters failed")
        return text

    async def close(self) -> None:
        await self.pool.close()

    async def add_worker(self, client: WorkerClient) -> None:
        await self.pool.add(client)

    @property
    def warm(self) -> bool:
        """Every routable worker's cache is in the index (each has answered a poll since it
        joined: the first poll is a snapshot). A router that joins a running fleet takes
        traffic only once warm, so its first decisions see what the others see."""
        live = [e for e in self.pool.workers.values() if e.healthy and not e.draining]
        return bool(live) and all(e.seq >= 0 for e in live)

    def health(self) -> tuple[bool, dict]:
        """(ready to take traffic, the /health body)."""
        live = self.pool.routable()
        warm = self.warm
        status = "ok" if live and warm else "warming" if live else "unavailable"
        return status == "ok", {
            "status": status,
            "model": self.model_name,
            "router_id": self.router_id,
            "routers": len(self.pool.fleet),
            "workers": len(self.pool.workers),
            "healthy_workers": len(live),
        }

    def start_drain(self, worker_id: str) -> None:
        task = asyncio.get_running_loop().create_task(self.pool.drain(worker_id))
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)
