"""``ServeTransport``: the worker protocol over a Serve deployment handle, pinned to one worker
replica (see ``replica_router``).

Every call is issued outside the caller's Serve request context. Inside an ingress request, Serve
stamps each handle call with the *parent request's* internal id, and its request router keys
pending calls by that id: the radixray router's retry after a failed first attempt (or a poll
asked for during a request) would then share an id with an earlier call, and Serve's router
could not tell them apart (the retry was never dispatched: found by the replica-kill test). A
fresh ``contextvars.Context`` gives each call its own ids; client disconnects are still handled
by radixray (``abort`` + closing the stream), not by Serve's parent-cancellation.

Transport failures (the replica is gone, its actor died, Serve refused the call, a timeout)
surface as ``WorkerUnavailable``, as over Ray, so the radixray router retries requests that have
not streamed a token yet and marks the worker down.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Callable

from radixray.protocol import WorkerClient, WorkerUnavailable
from radixray.protocol.transports import ray_transport_errors

from .replicas import TARGET_KWARG, ReplicaGone

__all__ = ["ServeTransport", "serve_worker_client"]


def _transport_errors() -> tuple[type[BaseException], ...]:
    from ray.serve.exceptions import RayServeException

    # Serve's own failures (back-pressure, deployment unavailable, cancelled) besides Ray's.
    return (ReplicaGone, RayServeException, *ray_transport_errors())


def _detached(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` in an empty context: no Serve request context to inherit."""
    return contextvars.Context().run(fn, *args, **kwargs)


class ServeTransport:
    """One worker replica. Every call is awaited (never ``ray.get`` in async code)."""

    def __init__(self, handle, replica_id: str, is_running: Callable[[str], bool] | None = None):
        """``handle``: the worker deployment's handle (its router is ``PinnedReplicaRouter``);
        ``is_running(replica_id)``: whether Serve still lists the replica (fail fast when not)."""
        self.address = f"serve-replica:{replica_id}"
        self.replica_id = replica_id
        self.handle = handle
        self._stream = handle.options(stream=True)
        self._is_running = is_running or (lambda _rid: True)
        self._errors = _transport_errors()
        self._pin = {TARGET_KWARG: replica_id}

    def _down(self, e: BaseException | str) -> WorkerUnavailable:
        what = e if isinstance(e, str) else f"{type(e).__name__}: {e}"
        return WorkerUnavailable(f"worker replica {self.replica_id}: {what}")

    def _require_running(self) -> None:
        if not self._is_running(self.replica_id):
            raise self._down("replica is no longer running")

    async def call(self, method: str, payload: bytes, timeout_s: float) -> bytes:
        self._require_running()
        try:
            resp = _detached(self.handle.call.remote, method, payload, **self._pin)
            return await asyncio.wait_for(resp, timeout_s)
        except self._errors as e:
            raise self._down(e) from e

    async def stream(self, method: str, payload: bytes) -> AsyncIterator[bytes]:
        self._require_running()
        try:
            gen = _detached(self._stream.stream.remote, method, payload, **self._pin)
            async for data in gen:
                yield data
        except self._errors as e:
            raise self._down(e) from e

    async def close(self) -> None:
        """Nothing to do: Serve owns the replica's lifecycle (scale down, restarts)."""


def serve_worker_client(
    handle, replica_id: str, is_running: Callable[[str], bool] | None = None
) -> WorkerClient:
    """The router's client for one worker replica (its worker id is the replica id)."""
    return WorkerClient(ServeTransport(handle, replica_id, is_running), replica_id)
