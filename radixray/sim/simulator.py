"""The discrete-event simulator: a router running a real policy over simulated workers.

Events, in time order (ties: step ends and KV-event deliveries before arrivals, then FIFO)::

    arrival      (at its time; a request with ``after``: when that request finishes)
                 build WorkerState for every worker and route with the live router's
                 ``Dispatcher`` (policy.choose, the record, the optimistic index entry,
                 on_dispatch), enqueue it on the chosen worker
    step end     a worker (the engine's Scheduler, sim/sim_worker.py) finishes a forward step:
                 tokens, first tokens, finishes; it emits KV events, delivered to the router's
                 index ``event_delay_s`` later
    kv events    ApproxIndex.apply(worker, events): stale optimistic entries are corrected

Everything random is drawn from generators seeded by ``SimConfig.seed`` (the workload has its own
seed), so one seed gives one result.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from radixray.cache_index import ApproxIndex
from radixray.protocol import Overloaded
from radixray.router.admission import Admission, queue_wait_s
from radixray.router.dispatch import DecisionRecord, Dispatcher
from radixray.router.policies import Policy, RoutingRequest, make_policy
from radixray.step_cost import pooled_decode_seq_s, pooled_fits
from radixray.worker.engine_config import EngineConfig
from radixray.worker.scheduler import Batch, SchedulerConfig, check_packing, check_prefill_order

from .hybrid import HybridPools, check_config, index_states, worker_kind
from .results import REFUSED, RequestRecord, RunResult, ceiling_hits, pooled_hits, ttft_bound
from .sim_worker import SimWorker
from .timing import DEFAULT_TIMING, TIMING_PRESETS, TimingModel
from .workload import SimRequest, Workload

__all__ = ["SimConfig", "Simulator", "simulate"]

_STEP, _EVENTS, _ARRIVE = 0, 1, 2


@dataclass(frozen=True)
class SimConfig:
    """One simulated cluster. ``num_pages`` is per worker, ``host_pages`` its host tier's (0:
    none; the timing model prices the copies); ``index_max_blocks`` bounds the router's index per
    worker and tier (default: the larger of the two, what a worker's tier can hold)."""

    num_workers: int = 8
    num_pages: int = 4096
    host_pages: int = 0
    # copy a device node to the host tier once it is hit this many times (None: write-back only)
    host_write_through_hits: int | None = None
    page_size: int = EngineConfig.page_size
    timing: TimingModel = field(default_factory=lambda: TIMING_PRESETS[DEFAULT_TIMING])
    eviction: str = EngineConfig.eviction
    event_delay_s: float | None = 0.05  # None: no KV events (the index only learns decisions)
    optimistic_index: bool = True
    index_max_blocks: int | None = None
    seed: int = 0
    check_every: int = 0  # run every worker's check_integrity every N steps (0: only at the end)
    prefill_order: str = SchedulerConfig.prefill_order  # the workers' scheduler's
    packing: str = SchedulerConfig.packing  # and how full a step that finishes a prompt gets
    # The live router's admission (RouterSettings): refuse an arrival (a 429) while this many
    # requests are in flight across the fleet, or while every worker has this many (running +
    # waiting). None: no limit, every request is served (the default).
    max_inflight: int | None = None
    max_inflight_per_worker: int | None = None
    # and while the least-queued worker would make an arrival wait longer than this before its
    # prefill (RouterSettings.max_queue_s, radixray/router/admission.py). None: no limit.
    max_queue_s: float | None = None
    # A model with sliding-window layers (sim/window.py): > 0 gives every worker the engine's
    # swa_radix cache, ``num_pages`` full pages and ``window_pages`` window pages of a
    # ``window``-token window; ``window_index`` False makes the router's index window-blind.
    window: int = 0
    window_pages: int = 0
    window_index: bool = True
    # A hybrid model (sim/hybrid.py): every worker gets its state slots and runs mamba_radix
    # (or a chunk cache); None: a model without state layers.
    hybrid: HybridPools | None = None
    # keep each request's candidate terms on its record (RequestRecord.terms; memory: a dict a
    # request), not only the term that decided
    explain: bool = False

    def __post_init__(self):
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.num_workers}")
        if self.num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {self.num_pages}")
        if self.host_pages < 0:
            raise ValueError(f"host_pages must be >= 0, got {self.host_pages}")
        if self.host_pages and (
            self.timing.load_bytes_per_s <= 0 or self.timing.kv_bytes_per_token <= 0
        ):
            raise ValueError(
                "a host tier needs a timing model with load_bytes_per_s and kv_bytes_per_token"
            )
        if self.event_delay_s is not None and self.event_delay_s < 0:
            raise ValueError(f"event_delay_s must be >= 0 or None, got {self.event_delay_s}")
        check_prefill_order(self.prefill_order)
        check_packing(self.packing)
        for name in ("max_inflight", "max_inflight_per_worker"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {v}")
        if self.max_queue_s is not None and not self.max_queue_s > 0:
            raise ValueError(f"max_queue_s must be > 0 or None, got {self.max_queue_s}")
        if self.window and (self.window_pages < 1 or self.host_pages):
            raise ValueError("a window pool needs window_pages >= 1 and no host tier")
        check_config(self)
        if self.event_delay_s is None and not self.optimistic_index:
            raise ValueError("with no KV events and no optimistic index the router sees nothing")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["timing"] = self.timing.to_dict()
        return d


StepHook = Callable[[int, float, float, Batch], None]


class Simulator:
    """``on_step(worker_id, start, duration, batch)`` is called for every step a simulated
    worker starts (``batch``: the engine's ``Batch``; read it, do not change it): a trace of
    what each worker computed when, for analyses that need more than the per-request report."""

    def __init__(
        self,
        workload: Workload,
        policy: Policy | str,
        config: SimConfig | None = None,
        on_step: StepHook | None = None,
    ):
        self.workload = workload
        self.config = config or SimConfig()
        if isinstance(policy, str):
            policy = make_policy(policy, seed=self.config.seed)
        self.policy = policy
        self.on_step = on_step

    def run(self, progress: bool | str = False) -> RunResult:
        label = progress if isinstance(progress, str) else self.policy.name
        run = _Run(self.workload, self.policy, self.config, self.on_step)
        return run.execute(label if progress else None)


class _Run:
    """One run's state: the workers, the router's index and dispatcher, the event heap."""

    def __init__(
        self, workload: Workload, policy: Policy, cfg: SimConfig, on_step: StepHook | None = None
    ):
        self.wl, self.policy, self.cfg, self.on_step = workload, policy, cfg, on_step
        P = cfg.page_size
        self.hashes = workload.block_hashes(P)
        blocks = cfg.index_max_blocks or max(cfg.num_pages, cfg.host_pages)
        self.index = ApproxIndex(P, blocks, cfg.window_index, index_states(cfg))
        # The live router's dispatch steps, with no decision log: records are kept below.
        self.dispatch = Dispatcher(
            policy, self.index, optimistic=cfg.optimistic_index, herd_window=0, decision_log_size=0
        )
        n = len(workload.requests)
        self.records: list[RequestRecord | None] = [None] * n
        self.decisions: list[DecisionRecord | None] = [None] * n
        self.pos_of = {r.rid: i for i, r in enumerate(workload.requests)}
        self.finished = [0] * n
        # closed-loop turns: rid -> the positions of the requests its finish releases
        self.released_by: dict[int, list[int]] = {}
        for k, r in enumerate(workload.requests):
            if r.after is not None:
                self.released_by.setdefault(r.after, []).append(k)
        self.emit = cfg.event_delay_s is not None
        make, kw = worker_kind(cfg)
        self.workers = [
            make(
                w,
                cfg.num_pages,
                P,
                cfg.timing,
                workload,
                cfg.eviction,
                self.emit,
                self._on_first_token,
                self._on_finish,
                cfg.prefill_order,
                cfg.host_pages,
                cfg.host_write_through_hits,
                packing=cfg.packing,
                **kw,
            )
            for w in range(cfg.num_workers)
        ]
        for w in self.workers:
            self.index.add_worker(w.worker_id)
        self.heap: list = []
        # The live router's admission (its counts and queueing-delay limit), as it decides.
        self.admission = Admission(cfg.max_inflight, cfg.max_queue_s, cfg.max_inflight_per_worker)
        self.seq = 0
        self.steps = 0
        self.mem_peak = 0

    # ------------------------------------------------------------------ callbacks from workers

    def _on_first_token(self, req: SimRequest, cached: int, now: float) -> None:
        i = self.pos_of[req.rid]
        rec = self.records[i]
        rec.first_token = now
        rec.cached = cached
        self.dispatch.first_token(self.decisions[i], req.rid)
        b = self.workers[rec.worker].breakdown.pop(str(req.rid), None)
        if b is not None:
            rec.wait_s, rec.forward_s, rec.copy_s = b[0] - rec.arrival, b[1], b[2]

    def _on_finish(self, req: SimRequest, cached: int, now: float) -> None:
        i = self.pos_of[req.rid]
        self.admission.release()
        self.dispatch.complete(self.decisions[i], req.rid, cached)
        self.decisions[i] = None  # its record is kept; the decision is no longer needed
        self._end(i, now)

    def _end(self, i: int, now: float) -> None:
        """Request ``i`` ended (served or refused): the turns waiting on it are released."""
        rid = self.wl.requests[i].rid
        self.finished[i] += 1
        self.records[i].finish = now
        for k in self.released_by.get(rid, ()):
            self.seq += 1
            at = max(now, self.wl.requests[k].arrival)
            heapq.heappush(self.heap, (at, 0, self.seq, _ARRIVE, None, k))

    # ------------------------------------------------------------------ events

    def _after_step(self, w: SimWorker, dt: float | None, now: float) -> None:
        """A worker's step started (``dt``: its duration) or it went idle (None); its KV events
        leave for the router's index."""
        if self.emit:
            evs = w.cache.take_events()
            if evs:
                self.seq += 1
                delay = self.cfg.event_delay_s
                if delay:
                    heapq.heappush(self.heap, (now + delay, 0, self.seq, _EVENTS, w.worker_id, evs))
                else:
                    self.index.apply(w.worker_id, evs)
        if dt is not None:
            self.seq += 1
            heapq.heappush(self.heap, (now + dt, 0, self.seq, _STEP, w.worker_id, None))
            if self.on_step is not None:
                self.on_step(w.worker_id, now, dt, w.batch)
        self.steps += 1
        if self.cfg.check_every and self.steps % self.cfg.check_every == 0:
            for x in self.workers:
                x.check_integrity()

    def _next_event(self) -> None:
        now, _, _, kind, wid, payload = heapq.heappop(self.heap)
        if kind == _STEP:
            w = self.workers[wid]
            self._after_step(w, w.step_end(now), now)
        elif kind == _EVENTS:
            self.index.apply(wid, payload)
        else:
            self._arrive(payload, now)

    def _arrive(self, i: int, now: float) -> None:
        """Route request ``i`` as the live router would and enqueue it on its worker."""
        req, hs = self.wl.requests[i], self.hashes[i]
        rreq = RoutingRequest(req.rid, req.num_tokens, hs, req.session, now)
        # One timing model, one performance class: the router pools the workers' fits.
        ws = self.workers
        fits = pooled_fits((w.worker_id, "sim", w.prefill_cost.moments, None) for w in ws)
        decode = pooled_decode_seq_s((w.worker_id, "sim", w.decode_cost.moments) for w in ws)
        states = [w.state(fits[w.worker_id], decode[w.worker_id]) for w in ws]
        if not self._admit(states):
            self.records[i] = RequestRecord(req.rid, -1, now, req.num_tokens, 0, REFUSED)
            self._end(i, now)
            return
        decision, rec = self.dispatch.decide(rreq, states)
        self.decisions[i] = rec
        wid = decision.worker_id
        self.records[i] = RequestRecord(
            req.rid,
            wid,
            now,
            req.num_tokens,
            rec.predicted_cached_tokens,
            decision.reason,
            available=rec.available_tokens,
            captured=rec.captured_tokens,
            decided_by=rec.decided_by,
            terms=_named(rec) if self.cfg.explain else None,
        )
        w = self.workers[wid]
        self._after_step(w, w.enqueue(req, hs, now), now)

    def _admit(self, states) -> bool:
        """Whether the live router's admission takes this arrival (else a 429). The simulated
        workers' prefill rates are measured from the start (warmed up, see SimWorker), so the
        queueing-delay limit applies at once."""
        adm = self.admission
        try:
            adm.admit()
        except Overloaded:
            return False
        try:
            adm.check_room(states, queue_wait_s(states) if adm.max_queue_s else None)
        except Overloaded:
            adm.release()
            return False
        return True

    def execute(self, progress: str | None) -> RunResult:
        reqs = self.wl.requests
        n = len(reqs)
        opened = [k for k, r in enumerate(reqs) if r.after is None]  # open-loop arrivals
        m = len(opened)
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=n, desc=progress, unit="req", leave=False)
        t0 = time.perf_counter()
        i = 0
        while i < m or self.heap:
            if self.heap and (i >= m or self.heap[0][0] <= reqs[opened[i]].arrival):
                self._next_event()
                continue
            k = opened[i]
            self._arrive(k, reqs[k].arrival)
            i += 1
            if i % 1024 == 0:
                self.mem_peak = max(self.mem_peak, self.index.memory_bytes())
            if bar is not None and i % 256 == 0:
                bar.update(256)
        if bar is not None:
            bar.update(n - bar.n)
            bar.close()
        return self._result(time.perf_counter() - t0)

    def _result(self, wall: float) -> RunResult:
        for w in self.workers:
            w.check_integrity()
        reqs = self.wl.requests
        bad = [reqs[k].rid for k in range(len(reqs)) if self.finished[k] != 1]
        if bad:
            raise AssertionError(f"{len(bad)} requests did not finish exactly once: {bad[:10]}")
        mem = self.index.memory_bytes()
        P, timing = self.cfg.page_size, self.cfg.timing
        # the pooled reference: one cache of the cluster's whole capacity, device and host
        total_pages = self.cfg.num_workers * (self.cfg.num_pages + self.cfg.host_pages)
        ceil = self.wl.memo(("ceiling_hits", P), lambda: ceiling_hits(self.wl, P))
        pooled = self.wl.memo(
            ("pooled_hits", P, total_pages), lambda: pooled_hits(self.wl, P, total_pages)
        )
        return RunResult(
            policy=self.policy.name,
            records=self.records,
            busy_time=[w.busy_time for w in self.workers],
            first_block_tokens=self.wl.first_block_tokens,
            ceiling_tokens=sum(ceil),
            index_memory_bytes=mem,
            index_memory_peak_bytes=max(mem, self.mem_peak),
            wall_s=wall,
            config={**self.cfg.to_dict(), "workload": self.wl.name, **self.wl.description},
            oversize=sum(w.oversize for w in self.workers),
            bound=ttft_bound(self.wl, P, timing, ceil),
            pooled_ttft=ttft_bound(self.wl, P, timing, pooled),
            pooled_tokens=sum(pooled),
            host_copies={
                "pages_to_host": sum(w.pages_to_host for w in self.workers),
                "pages_from_host": sum(w.pages_from_host for w in self.workers),
                "copy_seconds": sum(w.copy_seconds for w in self.workers),
            },
        )


def _named(rec: DecisionRecord) -> dict | None:
    """A decision's candidate terms as worker -> {term: seconds} (None: the policy has none)."""
    if rec.terms is None:
        return None
    return {w: dict(zip(rec.term_names, v, strict=True)) for w, v in rec.terms.items()}


def simulate(
    workload: Workload,
    policy: Policy | str,
    config: SimConfig | None = None,
    progress: bool | str = False,
    on_step: StepHook | None = None,
) -> RunResult:
    """Run one policy over one workload; see :class:`SimConfig` for the cluster and
    :class:`Simulator` for ``on_step``."""
    return Simulator(workload, policy, config, on_step).run(progress)
