"""``ServeWorkerClient``: radixray's ``WorkerClient`` protocol over a Serve deployment handle,
pinned to one worker replica (see ``replica_router``).

Every call is issued outside the caller's Serve request context. Inside an ingress request, Serve
stamps each handle call with the *parent request's* internal id, and its request router keys
pending calls by that id: the radixray router's retry after a failed first attempt (or a poll
kicked during a request) would then share an id with an earlier call, and Serve's router could
not tell them apart (the retry was never dispatched: found by the replica-kill test). A fresh
``contextvars.Context`` gives each call its own ids; client disconnects are still handled by
radixray (``abort`` + closing the stream), not by Serve's parent-cancellation.

Transport failures (the replica is gone, its actor died, Serve refused the call, a timeout)
surface as ``WorkerUnavailable``, as with ``RayWorkerClient``, so the radixray router retries
requests that have not streamed a token yet and marks the worker down.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable

from radixray.router.worker_client import (
    RemoteWorkerClient,
    WorkerUnavailable,
    ray_transport_errors,
)

from .replicas import TARGET_KWARG, ReplicaGone

__all__ = ["ServeWorkerClient"]


def _transport_errors() -> tuple[type[BaseException], ...]:
    from ray.serve.exceptions import RayServeException

    # Serve's own failures (back-pressure, deployment unavailable, cancelled) besides Ray's.
    return (ReplicaGone, RayServeException, *ray_transport_errors())


def _detached(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` in an empty context: no Serve request context to inherit."""
    return contextvars.Context().run(fn, *args, **kwargs)


class ServeWorkerClient(RemoteWorkerClient):
    """One worker replica. Every call is awaited (never ``ray.get`` in async code)."""

    def __init__(
        self,
        handle,
        replica_id: str,
        is_running: Callable[[str], bool] | None = None,
        call_timeout_s: float = 10.0,
        ready_timeout_s: float = 600.0,
    ):
        """``handle``: the worker deployment's handle (its router is ``PinnedReplicaRouter``);
        ``is_running(replica_id)``: whether Serve still lists the replica (fail fast when not)."""
        self.worker_id = replica_id
        self.handle = handle
        self._stream = handle.options(stream=True)
        self._is_running = is_running or (lambda _rid: True)
        self.call_timeout_s = call_timeout_s
        self.ready_timeout_s = ready_timeout_s
        self._errors = _transport_errors()

    def _require_running(self) -> None:
        if not self._is_running(self.worker_id):
            raise WorkerUnavailable(f"worker {self.worker_id}: replica is no longer running")

    async def _call(self, method: str, *args, timeout_s: float | None = None):
        self._require_running()
        try:
            method_handle = getattr(self.handle, method)
            resp = _detached(method_handle.remote, *args, **{TARGET_KWARG: self.worker_id})
            return await asyncio.wait_for(resp, timeout_s or self.call_timeout_s)
        except self._errors as e:
            raise self._unavailable(e) from e

    async def generate(self, prompt_ids, params, request_id, extra_key=None):
        self._require_running()
        try:
            gen = _detached(
                self._stream.generate.remote,
                list(prompt_ids),
                params,
                request_id,
                extra_key,
                **{TARGET_KWARG: self.worker_id},
            )
            async for chunk in gen:
                yield chunk
        except self._errors as e:
            raise self._unavailable(e) from e

    async def check_integrity(self) -> dict:
        return await self._call("check_integrity", timeout_s=60.0)

    async def close(self) -> None:
        """Nothing to do: Serve owns the replica's lifecycle (scale down, restarts)."""
