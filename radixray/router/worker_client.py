"""How the router talks to one worker: a small async protocol, over Ray or in-process.

Both clients speak to the same ``WorkerHost`` methods (see ``radixray.worker.actor``). Failures
of the transport (a dead actor, a lost node, a timeout) surface as ``WorkerUnavailable`` so the
router can tell "this worker is gone" from "this request was bad".
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

__all__ = [
    "WorkerClient",
    "RemoteWorkerClient",
    "RayWorkerClient",
    "LocalWorkerClient",
    "WorkerUnavailable",
    "ray_transport_errors",
]


class WorkerUnavailable(RuntimeError):
    """The worker cannot be reached or died; the request may be retried elsewhere."""


class WorkerClient(Protocol):
    worker_id: str

    def generate(
        self,
        prompt_ids: Sequence[int],
        params: dict,
        request_id: str,
        extra_key: str | None = None,
    ) -> AsyncIterator[dict]: ...

    async def abort(self, request_id: str) -> None: ...

    async def poll(self, since_seq: int, epoch: str | None) -> dict: ...

    async def health(self) -> dict: ...

    async def info(self) -> dict: ...

    async def close(self) -> None: ...


class LocalWorkerClient:
    """An in-process WorkerHost (``radixray worker``, tests): no serialization, same protocol."""

    def __init__(self, host, worker_id: str | None = None):
        self.host = host
        self.worker_id = worker_id or host.worker_id

    async def generate(self, prompt_ids, params, request_id, extra_key=None):
        async for chunk in self.host.generate(prompt_ids, params, request_id, extra_key):
            yield chunk

    async def abort(self, request_id: str) -> None:
        await self.host.abort(request_id)

    async def poll(self, since_seq: int, epoch: str | None) -> dict:
        return await self.host.poll(since_seq, epoch)

    async def health(self) -> dict:
        return await self.host.health()

    async def info(self) -> dict:
        return await self.host.info()

    async def close(self) -> None:
        await asyncio.to_thread(self.host.shutdown)


def ray_transport_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean "the worker is gone or unreachable" for a call through Ray."""
    import ray.exceptions as rex

    # ActorDiedError, ActorUnavailableError and NodeDiedError derive from these.
    return (
        rex.RayActorError,
        rex.ObjectLostError,
        rex.WorkerCrashedError,
        rex.NodeDiedError,
        rex.GetTimeoutError,
        asyncio.TimeoutError,
    )


class RemoteWorkerClient:
    """The request/response half of the protocol over a transport that subclasses provide as
    ``_call(method, *args, timeout_s=None)``; transport failures become WorkerUnavailable."""

    worker_id: str
    ready_timeout_s: float

    def _unavailable(self, e: BaseException) -> WorkerUnavailable:
        return WorkerUnavailable(f"worker {self.worker_id}: {type(e).__name__}: {e}")

    async def _call(self, method: str, *args, timeout_s: float | None = None):
        raise NotImplementedError

    async def abort(self, request_id: str) -> None:
        await self._call("abort", request_id)

    async def poll(self, since_seq: int, epoch: str | None) -> dict:
        return await self._call("poll", since_seq, epoch)

    async def health(self) -> dict:
        return await self._call("health")

    async def info(self) -> dict:
        # The first call waits for the worker to load its model: allow for a slow disk.
        return await self._call("info", timeout_s=self.ready_timeout_s)


class RayWorkerClient(RemoteWorkerClient):
    """A ``WorkerActor`` handle. Every call is awaited (never ``ray.get`` in async code)."""

    def __init__(
        self, handle, worker_id: str, call_timeout_s: float = 10.0, ready_timeout_s: float = 600.0
    ):
        self.handle = handle
        self.ready_timeout_s = ready_timeout_s
        self.worker_id = worker_id
        self.call_timeout_s = call_timeout_s
        self._errors = ray_transport_errors()

    async def _call(self, method: str, *args, timeout_s: float | None = None):
        try:
            ref = getattr(self.handle, method).remote(*args)
            return await asyncio.wait_for(ref, timeout_s or self.call_timeout_s)
        except self._errors as e:
            raise self._unavailable(e) from e

    async def generate(self, prompt_ids, params, request_id, extra_key=None):
        try:
            gen = self.handle.generate.options(num_returns="streaming").remote(
                list(prompt_ids), params, request_id, extra_key
            )
            async for ref in gen:
                yield await ref
        except self._errors as e:
            raise self._unavailable(e) from e

    async def close(self) -> None:
        import ray

        try:
            ray.kill(self.handle)
        except Exception:  # already dead: nothing to close
            pass
