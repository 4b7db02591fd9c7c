"""``Poller``: the feed from the workers to the router, one poll at a time.

Every ``interval_s`` each worker is asked for what changed since the router's last poll: its KV
events (applied to the index, or a snapshot that replaces the worker's part of it), its load
report and counters, and the routers that poll it (the fleet). A poll is also the circuit
breaker's probe while a worker is out. A worker whose poll fails repeatedly, that reports its
engine stopped, or that sends garbage is taken out of routing by its pool.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from radixray.cache_index.events import decode_events
from radixray.periodic import Periodic
from radixray.protocol import RequestError

if TYPE_CHECKING:
    from .worker_pool import WorkerEntry, WorkerPool

__all__ = ["Poller"]

log = logging.getLogger(__name__)


class Poller:
    def __init__(self, pool: WorkerPool, interval_s: float = 0.25, timeout_s: float = 2.0):
        self.pool = pool
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._ticker = Periodic(self.poll_all, interval_s, "worker poll", log)
        self._extra: set[asyncio.Task] = set()

    async def poll(self, entry: WorkerEntry) -> None:
        """One poll of one worker."""
        pool = self.pool
        if not entry.breaker.may_probe():
            return
        peak = entry.traffic.open_poll()
        reported = False
        try:
            resp = await asyncio.wait_for(
                entry.client.poll(entry.seq, entry.epoch, pool.router_id), self.timeout_s
            )
            reported = True
        except (RequestError, asyncio.TimeoutError) as e:
            if entry.breaker.record_failure():
                pool.went_down(entry, f"poll failed: {type(e).__name__}: {e}")
            return
        finally:
            # The worker took its report at some moment between our send and this receipt:
            # whatever of ours it may have counted (up to our peak in between) is not another
            # router's load.
            entry.traffic.close_poll(peak, reported)
        if not resp.alive:  # reachable, but its engine says it stopped for good
            pool.mark_down(entry.worker_id, "the worker reports its engine stopped")
            return
        try:
            batch = decode_events(resp.events)
        except ValueError as e:  # a worker that sends garbage is broken
            if entry.breaker.record_failure():
                pool.went_down(entry, f"poll sent invalid KV events: {e}")
            return
        if resp.snapshot:
            pool.index.clear(entry.worker_id)
            entry.snapshots += 1
        pool.index.apply(entry.worker_id, batch.events)
        entry.events_applied += len(batch.events)
        entry.epoch = resp.epoch
        entry.seq = resp.seq
        entry.report = resp.load
        entry.counters = resp.counters
        entry.last_ok = time.monotonic()
        pool.reported(entry)
        if entry.breaker.record_success():
            log.info("worker %s is back", entry.worker_id)

    def poll_now(self, entry: WorkerEntry) -> None:
        """Poll one worker now, without waiting for the next round."""
        task = asyncio.get_running_loop().create_task(self.poll(entry))
        self._extra.add(task)
        task.add_done_callback(self._extra.discard)

    async def poll_all(self) -> None:
        await asyncio.gather(*(self.poll(e) for e in list(self.pool.workers.values())))

    def start(self) -> None:
        self._ticker.start()

    async def stop(self) -> None:
        await self._ticker.stop()
