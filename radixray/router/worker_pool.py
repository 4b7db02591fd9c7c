"""The router's registry of workers: load accounting, health, KV-event feed, index ownership.

Load a policy sees on each worker is the sum of two parts:

* the router's own tally, exact and immediate for the traffic this router sent: requests not yet
  past their first token (waiting, with their predicted uncached prefill tokens) and requests
  decoding (with their context);
* other routers' traffic: the worker's last report (``poll``) less what of ours it counted.

Rates (prefill step cost, decode step time) only come from the workers' own measurements. Workers
of one performance class share one prefill fit over all their steps (see ``prefill_fits``). A
worker that never measured one borrows the mean of those that did, else a nominal prior, so a new
worker is neither shunned nor flooded.

The pool owns the worker side of the ``ApproxIndex``: a worker that fails is dropped from it
at once, a worker whose events were lost is rebuilt from a snapshot.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from radixray.cache_index import ApproxIndex
from radixray.cache_index.events import decode
from radixray.protocol import (
    TRAFFIC_FIELDS,
    LoadReport,
    RequestError,
    WorkerClient,
    WorkerCounters,
    WorkerInfo,
)
from radixray.step_cost import fit_moments, sum_moments

from .circuit_breaker import CircuitBreaker
from .policies import WorkerState

__all__ = ["WorkerPool", "WorkerEntry", "DuplicateWorker"]

log = logging.getLogger(__name__)
# Before any worker has measured its prefill rate: a CPU worker on the default model is in the
# thousands of tokens/s range; only the ratio between workers matters to the policies.
_PRIOR_PREFILL_TPS = 1000.0


class DuplicateWorker(ValueError):
    """Two workers claim one worker id."""


def _has_moments(e: WorkerEntry) -> bool:
    return e.report.prefill_fit_moments[0] > 0


@dataclass
class _InFlight:
    uncached_tokens: int
    context_tokens: int
    started: bool = False


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
    inflight: dict[str, _InFlight] = field(default_factory=dict)
    events_applied: int = 0
    snapshots: int = 0
    # This router's traffic on the worker, in the report's terms, kept as requests move.
    own: dict = field(default_factory=lambda: dict.fromkeys(TRAFFIC_FIELDS, 0))
    # Our traffic as the report counted it: its peak over the poll that brought the report.
    own_at_report: dict = field(default_factory=dict)
    open_polls: list = field(default_factory=list)  # peak tallies of polls in flight

    @property
    def healthy(self) -> bool:
        return self.breaker.closed


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
        self.poll_interval_s = poll_interval_s
        self.failure_threshold = failure_threshold
        self.poll_timeout_s = poll_timeout_s
        self.workers: dict[str, WorkerEntry] = {}
        self._poll_task: asyncio.Task | None = None
        self._extra_polls: set[asyncio.Task] = set()
        self._fits: dict[str, tuple[float, float]] | None = None  # prefill_fits(), until a report
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
        await self._poll_worker(entry)
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
            self._went_down(entry, reason)

    def _went_down(self, entry: WorkerEntry, reason: str) -> None:
        log.warning("worker %s is down: %s", entry.worker_id, reason)
        entry.epoch = None  # a later recovery starts from a snapshot
        self.index.clear(entry.worker_id)

    # ------------------------------------------------------------------ load accounting

    def track_dispatch(self, worker_id: str, request_id: str, uncached: int, context: int):
        entry = self.workers[worker_id]
        entry.inflight[request_id] = _InFlight(uncached, context)
        self._count(entry, waiting=1, queued_prefill_tokens=uncached)

    def track_first_token(self, worker_id: str, request_id: str) -> None:
        entry = self.workers.get(worker_id)
        f = entry.inflight.get(request_id) if entry else None
        if f is not None and not f.started:
            f.started = True
            self._count(
                entry,
                waiting=-1,
                queued_prefill_tokens=-f.uncached_tokens,
                running=1,
                active_decode_tokens=f.context_tokens,
            )

    def track_tokens(self, worker_id: str, request_id: str, n: int) -> None:
        """``n`` more tokens generated: the request's context on the worker grew by ``n``."""
        entry = self.workers.get(worker_id)
        f = entry.inflight.get(request_id) if entry else None
        if f is not None and n:
            f.context_tokens += n
            if f.started:
                self._count(entry, active_decode_tokens=n)

    def track_finish(self, worker_id: str, request_id: str) -> None:
        entry = self.workers.get(worker_id)
        f = entry.inflight.pop(request_id, None) if entry else None
        if f is None:
            return
        if f.started:
            self._count(entry, running=-1, active_decode_tokens=-f.context_tokens)
        else:
            self._count(entry, waiting=-1, queued_prefill_tokens=-f.uncached_tokens)

    @staticmethod
    def _count(entry: WorkerEntry, **delta: int) -> None:
        own = entry.own
        for k, d in delta.items():
            own[k] += d
        # A poll in flight may see the worker at any moment until its reply: remember the most
        # of our traffic it could have counted, so none of it is taken for another router's.
        for peak in entry.open_polls:
            for k in delta:
                if own[k] > peak[k]:
                    peak[k] = own[k]

    def prefill_fits(self) -> dict[str, tuple[float, float]]:
        """Each worker's prefill step cost ``(overhead_s, tokens_per_s)``.

        Workers of one performance class (their ``info.perf_class``: same model, dtype,
        device type and threads) share one fit over all their reported steps, so the router
        compares their load and cache, not the noise between their separate fits. A worker that
        reports no class or no moments keeps its own fit; one with no measurement yet borrows
        the mean rate of those that have one, else a nominal prior.
        """
        groups: dict[object, list[WorkerEntry]] = {}
        for e in self.workers.values():
            groups.setdefault(e.info.perf_class or ("worker", e.worker_id), []).append(e)
        fits: dict[str, tuple[float, float]] = {}
        for members in groups.values():
            moments = [e.report.prefill_fit_moments for e in members if _has_moments(e)]
            pooled = fit_moments(sum_moments(moments)) if moments else None
            for e in members:
                r = e.report
                if pooled is not None:
                    fits[e.worker_id] = pooled
                elif r.prefill_tokens_per_s:
                    fits[e.worker_id] = (r.prefill_overhead_s or 0.0, r.prefill_tokens_per_s)
        prior = sum(rate for _, rate in fits.values()) / len(fits) if fits else _PRIOR_PREFILL_TPS
        for wid in self.workers:
            fits.setdefault(wid, (0.0, prior))
        return fits

    def states(self) -> list[WorkerState]:
        """What the policy sees: routable workers only (healthy, not draining).

        Load = this router's own traffic now (exact, immediate) + the rest of the worker's last
        report (other routers' traffic): the report minus our own traffic when it was taken.
        Adding the stale report as it is would make a worker that just finished our request look
        busy until the next poll, and push that request's successors off their cached prefix.
        """
        if self._fits is None:
            self._fits = self.prefill_fits()
        fits = self._fits
        out = []
        for e in self.workers.values():
            if not e.healthy or e.draining:
                continue
            r = e.report
            own, at = e.own, e.own_at_report
            overhead, rate = fits.get(e.worker_id, (0.0, _PRIOR_PREFILL_TPS))
            # Per request and per worker: the four fields spelled out (TRAFFIC_FIELDS).
            out.append(
                WorkerState(
                    e.worker_id,
                    own["running"] + max(0, r.running - at.get("running", 0)),
                    own["waiting"] + max(0, r.waiting - at.get("waiting", 0)),
                    own["queued_prefill_tokens"]
                    + max(0, r.queued_prefill_tokens - at.get("queued_prefill_tokens", 0)),
                    own["active_decode_tokens"]
                    + max(0, r.active_decode_tokens - at.get("active_decode_tokens", 0)),
                    r.free_pages,
                    r.total_pages,
                    rate,
                    overhead,
                    r.decode_step_s or 0.0,
                    True,
                )
            )
        return out

    def routable(self) -> list[str]:
        return [w.worker_id for w in self.states()]

    # ------------------------------------------------------------------ polling

    async def _poll_worker(self, entry: WorkerEntry) -> None:
        """One poll; it is also the circuit breaker's probe while the worker is out."""
        if not entry.breaker.may_probe():
            return
        peak = dict(entry.own)
        entry.open_polls.append(peak)
        try:
            resp = await asyncio.wait_for(
                entry.client.poll(entry.seq, entry.epoch, self.router_id), self.poll_timeout_s
            )
        except (RequestError, asyncio.TimeoutError) as e:
            if entry.breaker.record_failure():
                self._went_down(entry, f"poll failed: {type(e).__name__}: {e}")
            return
        finally:  # by identity: polls open at once (one asked for during a round) may be equal
            entry.open_polls = [p for p in entry.open_polls if p is not peak]
        if not resp.alive:  # reachable, but its engine says it stopped for good
            self.mark_down(entry.worker_id, "the worker reports its engine stopped")
            return
        try:
            batch = decode(resp.events)
        except ValueError as e:  # a worker that sends garbage is broken
            if entry.breaker.record_failure():
                self._went_down(entry, f"poll sent invalid KV events: {e}")
            return
        if resp.snapshot:
            self.index.clear(entry.worker_id)
            entry.snapshots += 1
        self.index.apply(entry.worker_id, batch.events)
        entry.events_applied += len(batch.events)
        entry.epoch = resp.epoch
        entry.seq = resp.seq
        entry.report = resp.load
        self._fits = None
        self._update_fleet()
        # The worker took its report at some moment between our send and this receipt: whatever
        # of ours it may have counted (up to our peak in between) is not another router's load.
        entry.own_at_report = peak
        entry.counters = resp.counters
        entry.last_ok = time.monotonic()
        if entry.breaker.record_success():
            log.info("worker %s is back", entry.worker_id)

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
            task = asyncio.get_running_loop().create_task(self._poll_worker(entry))
            self._extra_polls.add(task)
            task.add_done_callback(self._extra_polls.discard)

    async def poll_once(self) -> None:
        entries = list(self.workers.values())
        await asyncio.gather(*(self._poll_worker(e) for e in entries))

    async def _poll_forever(self) -> None:
        while True:
            try:
                await self.poll_once()
            except Exception:  # never let the feed die: log and keep polling
                log.exception("worker poll failed")
            await asyncio.sleep(self.poll_interval_s)

    def start(self) -> None:
        if self._poll_task is None:
            self._poll_task = asyncio.get_running_loop().create_task(self._poll_forever())

    async def stop(self) -> None:
        if self._poll_task is not None:
            self._poll_task.cancel()
            try:
                await self._poll_task
            except asyncio.CancelledError:
                pass
            self._poll_task = None

    async def close(self) -> None:
        await self.stop()
        for wid in list(self.workers):
            await self.remove(wid)
