"""The router's workers: who they are, whether they take traffic, and what a policy sees.

The pool owns the worker side of the ``ApproxIndex`` (a worker that fails is dropped from it at
once, a worker whose events were lost is rebuilt from a snapshot) and composes the parts, one
noun each:

* ``Traffic`` (``traffic.py``): this router's own requests on a worker, counted as they move
  (each request moves itself: ``RoutedRequest`` in ``request_path.py``);
* ``Poller`` (``poller.py``): the feed of KV events, load reports and counters from the workers;
* ``pooled_prefill_fits``, ``pooled_decode_costs`` (``prefill_fits.py``): each worker's prefill
  and decode costs, pooled per class.

Load a policy sees on a worker is ours now plus the others' from the worker's last report; rates
only come from the workers' own measurements.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from radixray.cache_index import ApproxIndex
from radixray.protocol import LoadReport, WorkerClient, WorkerCounters, WorkerInfo

from .admission import queue_wait_s
from .circuit_breaker import CircuitBreaker
from .policies import WorkerState
from .poller import Poller
from .prefill_fits import PRIOR_PREFILL_TPS, pooled_decode_costs, pooled_prefill_fits
from .traffic import Traffic

__all__ = ["WorkerPool", "WorkerEntry", "DuplicateWorker"]

log = logging.getLogger(__name__)


class DuplicateWorker(ValueError):
    """Two workers claim one worker id."""


@dataclass
class WorkerEntry:
    client: WorkerClient
    worker_id: str
    info: WorkerInfo
    report: LoadReport = field(default_factory=LoadReport)  # the last poll's
    counters: WorkerCounters = field(default_factory=WorkerCounters)  # the last poll's
    epoch: str | None = None
    seq: int = -1
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    draining: bool = False
    last_ok: float = field(default_factory=time.monotonic)
    traffic: Traffic = field(default_factory=Traffic)  # this router's requests on it
    events_applied: int = 0
    snapshots: int = 0

    @property
    def healthy(self) -> bool:
        return self.breaker.closed

    @property
    def inflight(self) -> dict:
        """This router's requests on the worker, by id."""
        return self.traffic.requests


class WorkerPool:
    def __init__(
        self,
        index: ApproxIndex,
        poll_interval_s: float = 0.25,
        failure_threshold: int = 2,
        poll_timeout_s: float = 2.0,
        router_id: str | None = None,
    ):
        """``router_id``: how this router names itself to the workers it polls (they list the
        routers that poll them, so the routers of a fleet learn of each other)."""
        self.index = index
        self.router_id = router_id
        self.failure_threshold = failure_threshold
        self.workers: dict[str, WorkerEntry] = {}
        self.poller = Poller(self, poll_interval_s, poll_timeout_s)
        # (prefill fits, decode costs) pooled per class, until the next report or membership change
        self._fits: tuple[dict[str, tuple[float, float]], dict[str, float]] | None = None
        self.fleet: tuple[str, ...] = (router_id,) if router_id else ()

    # ------------------------------------------------------------------ membership

    async def add(self, client: WorkerClient) -> WorkerEntry:
        """Register a worker (its page size must match the router's; its id must be new)."""
        info = await client.info()
        if info.page_size != self.index.page_size:
            raise ValueError(
                f"worker {client.worker_id} at {client.address} has page_size {info.page_size}, "
                f"the router hashes pages of {self.index.page_size}"
            )
        wid = client.worker_id
        if wid in self.workers:
            other = self.workers[wid]
            raise DuplicateWorker(
                f"two workers claim the worker id {wid!r}: {other.client.address} "
                f"({other.info.address}) and {client.address} ({info.address}); give each its "
                "own --worker-id"
            )
        entry = WorkerEntry(client, wid, info, breaker=CircuitBreaker(self.failure_threshold))
        self.workers[client.worker_id] = entry
        self._fits = None
        self.index.add_worker(client.worker_id)
        await self.poller.poll(entry)
        return entry

    async def remove(self, worker_id: str, close: bool = True) -> None:
        entry = self.workers.pop(worker_id, None)
        self._fits = None
        self.index.remove_worker(worker_id)
        if entry is not None and close:
            await entry.client.close()

    async def drain(self, worker_id: str, timeout_s: float = 300.0) -> None:
        """No new requests; wait for in-flight ones to finish; then remove the worker."""
        entry = self.workers[worker_id]
        entry.draining = True
        deadline = time.monotonic() + timeout_s
        while entry.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await self.remove(worker_id)

    def mark_down(self, worker_id: str, reason: str) -> None:
        """The worker failed: stop routing to it and forget what it held."""
        entry = self.workers.get(worker_id)
        if entry is not None and entry.breaker.trip():
            self.went_down(entry, reason)

    def went_down(self, entry: WorkerEntry, reason: str) -> None:
        log.warning("worker %s is down: %s", entry.worker_id, reason)
        entry.epoch = None  # a later recovery starts from a snapshot
        self.index.clear(entry.worker_id)

    # ------------------------------------------------------------------ what policies see

    def prefill_fits(self) -> dict[str, tuple[float, float]]:
        """Each worker's prefill step cost ``(overhead_s, tokens_per_s)``, pooled over its
        performance class (``prefill_fits.py``)."""
        return pooled_prefill_fits(self.workers.values())

    def states(self) -> list[WorkerState]:
        """What the policy sees: routable workers only (healthy, not draining).

        Load = this router's own traffic now (exact, immediate) + the rest of the worker's last
        report (other routers' traffic): the report minus our own traffic when it was taken.
        Adding the stale report as it is would make a worker that just finished our request look
        busy until the next poll, and push that request's successors off their cached prefix.
        """
        if self._fits is None:
            self._fits = (self.prefill_fits(), pooled_decode_costs(self.workers.values()))
        fits, decode = self._fits
        out = []
        for e in self.workers.values():
            if not e.healthy or e.draining:
                continue
            r = e.report
            overhead, rate = fits.get(e.worker_id, (0.0, PRIOR_PREFILL_TPS))
            running, waiting, queued, decoding = e.traffic.load(r)
            out.append(
                WorkerState(
                    e.worker_id,
                    running,
                    waiting,
                    queued,
                    decoding,
                    r.free_pages,
                    r.total_pages,
                    rate,
                    overhead,
                    r.decode_step_s or 0.0,
                    True,
                    *_load_cost(r),
                    r.max_batch_tokens,
                    host_free_pages=r.host_free_pages,
                    host_total_pages=r.host_total_pages,
                    decode_seq_s=decode.get(e.worker_id, 0.0),
                    answer_tokens=r.answer_tokens or 0.0,
                    reuses=e.info.cache != "chunk",
                )
            )
        return out

    def queue_wait_s(self, states: list[WorkerState] | None = None) -> float | None:
        """The shortest queueing delay a new request would meet on a routable worker, in
        seconds at the workers' prefill fits (``admission.queue_wait_s``); None while no
        worker has measured a prefill step (a prior rate says nothing about time)."""
        if not any(_measured(e.report) for e in self.workers.values()):
            return None
        return queue_wait_s(self.states() if states is None else states)

    def routable(self) -> list[str]:
        return [w.worker_id for w in self.states()]

    # ------------------------------------------------------------------ the feed

    def reported(self, entry: WorkerEntry) -> None:
        """A poll of ``entry`` landed (called by the poller)."""
        self._fits = None
        self._update_fleet()

    def _update_fleet(self) -> None:
        routers = {r for e in self.workers.values() for r in e.report.routers}
        if self.router_id:
            routers.add(self.router_id)
        self.fleet = tuple(sorted(routers))

    def fleet_position(self) -> tuple[int, int]:
        """(this router's rank, how many routers) among those the workers report."""
        fleet = self.fleet
        if len(fleet) <= 1 or self.router_id not in fleet:
            return 0, max(1, len(fleet))
        return fleet.index(self.router_id), len(fleet)

    def poll_now(self, worker_id: str) -> None:
        """Poll one worker now (its view looked stale), without waiting for the next round."""
        entry = self.workers.get(worker_id)
        if entry is not None and entry.healthy:
            self.poller.poll_now(entry)

    async def poll_once(self) -> None:
        await self.poller.poll_all()

    def start(self) -> None:
        self.poller.start()

    async def stop(self) -> None:
        await self.poller.stop()

    async def close(self) -> None:
        await self.stop()
        for wid in list(self.workers):
            await self.remove(wid)


# Before a worker has loaded anything back its rate is unknown: assume this many bytes per second
# (a plain memory copy on a busy host, a PCIe link at a third of its peak; the fit replaces it
# after the first load-back), so a fresh router prices a host hit as a load, not a recompute.
PRIOR_LOAD_BYTES_PER_S = 8e9


def _load_cost(r: LoadReport) -> tuple[float, float]:
    """A report's host-tier load-back as ``(tokens_per_s, overhead_s)``; (0, 0) without one."""
    if not r.host_total_pages or not r.kv_bytes_per_token:
        return 0.0, 0.0
    rate = r.load_bytes_per_s or PRIOR_LOAD_BYTES_PER_S
    return rate / r.kv_bytes_per_token, r.load_overhead_s or 0.0


def _measured(r: LoadReport) -> bool:
    """Whether a worker's report carries a prefill rate it measured."""
    moments = r.prefill_fit_moments
    return bool(r.prefill_tokens_per_s) or bool(moments and moments[0] > 0)
