"""Keeps the router's worker pool equal to the worker deployment's running replicas.

Serve decides how many workers exist (``num_replicas`` or autoscaling) and restarts failed ones;
this loop follows it:

* a replica Serve lists that the pool has never seen is added (``RouterService.add_worker``:
  its ``info`` is read and its cache is indexed from a snapshot of its KV events);
* a replica Serve no longer lists is drained out of the pool (no new requests; in-flight ones
  finish while Serve's graceful shutdown keeps the replica alive), and its index is dropped.

A replica an operator removed through ``/admin/workers`` is not re-added: only replicas never
seen are added.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from radixray.periodic import Periodic
from radixray.router.service import RouterService

__all__ = ["ReplicaMembership"]

log = logging.getLogger(__name__)


class ReplicaMembership:
    def __init__(
        self,
        service: RouterService,
        list_replicas: Callable[[], frozenset[str] | None],
        make_client: Callable[[str], object],
        interval_s: float = 1.0,
    ):
        """``list_replicas()``: the running replica ids (None: not known yet);
        ``make_client(replica_id)``: a ``WorkerClient`` for that replica."""
        self.service = service
        self.list_replicas = list_replicas
        self.make_client = make_client
        self.interval_s = interval_s
        self._seen: set[str] = set()
        self._adding: dict[str, asyncio.Task] = {}
        self._ticker = Periodic(self.sync_once, interval_s, "worker membership sync", log)

    async def sync_once(self) -> None:
        running = self.list_replicas()
        if running is None:
            return
        for rid in sorted(running - self._seen):
            self._seen.add(rid)
            self._adding[rid] = asyncio.get_running_loop().create_task(self._add(rid))
        pool = self.service.pool
        for rid in sorted(self._seen - running):
            self._seen.discard(rid)
            task = self._adding.pop(rid, None)
            if task is not None:
                task.cancel()
            entry = pool.workers.get(rid)
            if entry is not None and not entry.draining:
                log.info("worker replica %s left the deployment: draining it", rid)
                self.service.start_drain(rid)

    async def _add(self, rid: str) -> None:
        try:
            await self.service.add_worker(self.make_client(rid))
            log.info("worker replica %s joined", rid)
        except Exception as e:  # retried on the next round unless the replica is gone
            log.warning("could not add worker replica %s: %s", rid, e)
            self._seen.discard(rid)
        finally:
            self._adding.pop(rid, None)

    async def wait_for_workers(self, n: int, timeout_s: float) -> int:
        """Sync until ``n`` workers are in the pool or ``timeout_s`` passes; returns how many."""
        deadline = time.monotonic() + timeout_s
        while True:
            await self.sync_once()
            have = len(self.service.pool.workers)
            if have >= n or time.monotonic() >= deadline:
                return have
            await asyncio.sleep(min(0.2, self.interval_s))

    def start(self) -> None:
        self._ticker.start()

    async def stop(self) -> None:
        await self._ticker.stop()
        adding = list(self._adding.values())
        for t in adding:
            t.cancel()
        await asyncio.gather(*adding, return_exceptions=True)
        self._adding.clear()
