"""Transports of the worker protocol in process and over Ray (HTTP: ``http_transport.py``; Ray
Serve: ``radixray.deploy.serve_client``). Each moves encoded calls and nothing else.

Over Ray, a worker actor exposes two methods whatever the protocol holds: ``call(method,
payload) -> bytes`` and the streaming generator ``stream(method, payload)``. Arguments and
results are ``bytes``, so Ray never pickles a protocol object.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from .errors import WorkerUnavailable
from .http_transport import HttpTransport
from .rpc import WorkerHandler, serve_call, serve_stream

__all__ = ["LocalTransport", "RayTransport", "RayHttpTransport", "ray_transport_errors"]


class LocalTransport:
    """A worker handler in this process (tests, a single-process setup): the same encoded
    calls, without a network. ``owner``: closing the transport shuts the worker down."""

    def __init__(self, handler: WorkerHandler, address: str = "local", owner: bool = True):
        self.handler = handler
        self.address = address
        self.owner = owner

    async def call(self, method: str, payload: bytes, timeout_s: float) -> bytes:
        try:
            return await asyncio.wait_for(serve_call(self.handler, method, payload), timeout_s)
        except asyncio.TimeoutError:
            raise WorkerUnavailable(
                f"local worker: {method} timed out after {timeout_s}s"
            ) from None

    def stream(self, method: str, payload: bytes) -> AsyncIterator[bytes]:
        return serve_stream(self.handler, method, payload)

    async def close(self) -> None:
        shutdown = getattr(self.handler, "shutdown", None)
        if self.owner and shutdown is not None:
            await asyncio.to_thread(shutdown)


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


class RayTransport:
    """A worker actor's handle. Every call is awaited (never ``ray.get`` in async code)."""

    def __init__(self, handle, address: str | None = None, kill_on_close: bool = True):
        self.handle = handle
        self.address = address or f"ray-actor:{handle._actor_id.hex()}"
        self.kill_on_close = kill_on_close
        self._errors = ray_transport_errors()
        self._stream = handle.stream.options(num_returns="streaming")

    def _down(self, e: BaseException) -> WorkerUnavailable:
        return WorkerUnavailable(f"worker actor {self.address}: {type(e).__name__}: {e}")

    async def call(self, method: str, payload: bytes, timeout_s: float) -> bytes:
        try:
            return await asyncio.wait_for(self.handle.call.remote(method, payload), timeout_s)
        except self._errors as e:
            raise self._down(e) from e

    async def stream(self, method: str, payload: bytes) -> AsyncIterator[bytes]:
        try:
            gen = self._stream.remote(method, payload)
            async for ref in gen:
                yield await ref
        except self._errors as e:
            raise self._down(e) from e

    async def close(self) -> None:
        if not self.kill_on_close:
            return
        import ray

        try:
            ray.kill(self.handle)
        except Exception:  # already dead: nothing to close
            pass


class RayHttpTransport(HttpTransport):
    """A worker actor reached over its own HTTP server (``HttpWorkerHost.start_http``): Ray places
    it, runs it and names it; requests go over HTTP. Measured on this repository's benchmark
    (benchmarks/README.md, "Router process cost"), a call through the actor handle cost the
    router several times the CPU of the same call over HTTP (argument binding, serialization
    and the streaming-generator machinery of each ``.remote()``, Ray's IO threads).
    Closing it kills the actor when the router owns it."""

    def __init__(self, handle, url: str, token: str | None, kill_on_close: bool = True, **kw):
        super().__init__(url, token, **kw)
        self.handle = handle
        self.kill_on_close = kill_on_close

    async def close(self) -> None:
        await super().close()
        if self.kill_on_close:
            import ray

            try:
                ray.kill(self.handle)
            except Exception:  # already dead: nothing to close
                pass
