"""The worker deployment's replica: one ``WorkerHost`` (one engine) per Serve replica.

A plain class; ``radixray.deploy.serve`` applies ``serve.deployment`` to it with the pinned
request router. Every method takes the keyword ``replica``, the unique id of the replica the
caller meant: the router pins on it, and the replica checks it, so a call that Serve delivered
to the wrong replica fails loudly instead of reading another engine's cache.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from radixray.worker.host import WorkerHost

__all__ = ["WorkerReplica", "WrongReplica"]


class WrongReplica(RuntimeError):
    """A pinned call reached a replica other than its target (a routing bug)."""


def _own_replica_id() -> str:
    from ray import serve

    return serve.get_replica_context().replica_id.unique_id


class WorkerReplica:
    def __init__(self, engine: dict, replica_id: str | None = None):
        """``engine``: EngineConfig fields; the worker id is this replica's unique id, so the
        router's worker ids, the KV events and the ``x-radixray-worker`` header all agree."""
        self.replica_id = replica_id or _own_replica_id()
        self.host = WorkerHost({**engine, "worker_id": self.replica_id}, self.replica_id)

    def _check(self, replica: str | None) -> None:
        if replica is not None and replica != self.replica_id:
            raise WrongReplica(f"call for replica {replica!r} reached {self.replica_id!r}")

    async def call(self, method: str, payload: bytes, *, replica: str | None = None) -> bytes:
        """One encoded call of the worker protocol (``radixray.protocol.rpc``)."""
        self._check(replica)
        return await self.host.call(method, payload)

    async def stream(
        self, method: str, payload: bytes, *, replica: str | None = None
    ) -> AsyncIterator[bytes]:
        """One encoded streaming call (``generate``): encoded chunks."""
        self._check(replica)
        async for data in self.host.stream(method, payload):
            yield data

    async def check_integrity(self, *, replica: str | None = None) -> dict:
        self._check(replica)
        return await self.host.check_integrity()

    async def check_health(self) -> None:
        """Serve's own health check: a dead engine thread restarts the replica."""
        h = await self.host.health()
        if not h.ok:
            raise RuntimeError(f"worker {self.replica_id}: engine loop is not running")

    def __del__(self):
        host = getattr(self, "host", None)
        if host is not None:
            host.shutdown()
