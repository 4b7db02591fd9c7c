"""The router service: model metadata, the worker pool, the router, metrics and limits in one
object that the HTTP routes depend on. Built once per process (``radixray serve``, the Ray Serve
ingress, tests). It is the OpenAI edge's backend (``radixray.api.Backend``): ``open`` admits a
request (or refuses it, overloaded) and routes it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from radixray.cache_index import ApproxIndex
from radixray.model_meta import ModelMeta
from radixray.protocol import GenerateRequest, Overloaded, WorkerClient

from .metrics import RouterMetrics
from .policies import Policy, make_policy
from .router import RoutedStream, Router
from .worker_pool import WorkerPool

__all__ = ["RouterSettings", "RouterService", "Overloaded"]


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
    retry_after_s: int = 1
    poll_interval_s: float = 0.25
    max_index_blocks_per_worker: int = 1 << 20
    max_retries: int = 2
    seed: int = 0

    def __post_init__(self):
        for name in (
            "max_body_bytes",
            "max_inflight",
            "max_inflight_per_worker",
            "max_index_blocks_per_worker",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"RouterSettings.{name} must be >= 1, got {getattr(self, name)}")


WorkerFactory = Callable[[dict], Awaitable[WorkerClient]]


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
        self.index = ApproxIndex(settings.page_size, settings.max_index_blocks_per_worker)
        self.pool = WorkerPool(self.index, settings.poll_interval_s)
        self.policy = policy or make_policy(settings.policy, seed=settings.seed)
        self.router = Router(
            self.pool,
            self.policy,
            self.index,
            max_retries=settings.max_retries,
            max_inflight_per_worker=settings.max_inflight_per_worker,
        )
        self.metrics = RouterMetrics()
        self.router.listeners.append(self.metrics.on_decision)
        self.worker_factory = worker_factory
        self.inflight = 0
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

    async def open(self, req: GenerateRequest, session_key: str | None = None) -> RoutedStream:
        """Admit and route ``req``; the admission slot is released when its stream ends."""
        self.admit()
        try:
            return await self.router.open(req, session_key, on_close=self.release)
        except BaseException:
            self.release()
            raise

    async def start(self) -> None:
        self.pool.start()

    async def stop(self) -> None:
        await self.pool.stop()

    async def close(self) -> None:
        await self.pool.close()

    async def add_worker(self, client: WorkerClient) -> None:
        await self.pool.add(client)

    def admit(self) -> None:
        """Reserve a slot for one request or raise Overloaded (the router refuses too when every
        worker is at ``max_inflight_per_worker``)."""
        limit = self.settings.max_inflight
        if self.inflight >= limit:
            raise Overloaded(
                f"The server is overloaded: {self.inflight} requests in flight (limit "
                f"{limit}); retry later"
            )
        self.inflight += 1

    def release(self) -> None:
        self.inflight -= 1

    def start_drain(self, worker_id: str) -> None:
        task = asyncio.get_running_loop().create_task(self.pool.drain(worker_id))
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)
