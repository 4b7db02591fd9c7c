"""The discrete-event simulator: a router running a real policy over simulated workers.

Events, in time order (ties: step ends and KV-event deliveries before arrivals, then FIFO)::

    arrival      build WorkerState for every worker, policy.choose(...), record the decision,
                 optimistically index the request's blocks on the chosen worker (the live
                 router's "learn from its own decisions"), enqueue it there
    step end     a worker finishes a forward step: tokens, first tokens, finishes; it emits KV
                 events, delivered to the router's index ``event_delay_s`` later
    kv events    ApproxIndex.apply(worker, events): stale optimistic entries are corrected

Everything random is drawn from generators seeded by ``SimConfig.seed`` (the workload has its own
seed), so one seed gives one result.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import asdict, dataclass, field

from radixray.cache_index import ApproxIndex
from radixray.router.policies import Policy, RoutingRequest, make_policy
from radixray.step_cost import fit_moments, sum_moments

from .metrics import RequestRecord, RunResult, ceiling
from .timing import TIMING_PRESETS, TimingModel
from .worker import ReqState, SimWorker
from .workload import Workload

__all__ = ["SimConfig", "Simulator", "simulate"]

_STEP, _EVENTS = 0, 1


@dataclass(frozen=True)
class SimConfig:
    """One simulated cluster. ``num_pages`` is per worker; ``index_max_blocks`` bounds the
    router's index per worker (default: ``num_pages``, what the worker can hold)."""

    num_workers: int = 8
    num_pages: int = 4096
    page_size: int = 16
    timing: TimingModel = field(default_factory=lambda: TIMING_PRESETS["cpu"])
    eviction: str = "lru"
    event_delay_s: float | None = 0.05  # None: no KV events (the index only learns decisions)
    optimistic_index: bool = True
    index_max_blocks: int | None = None
    seed: int = 0
    check_every: int = 0  # run every worker's check_integrity every N steps (0: only at the end)

    def __post_init__(self):
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.num_workers}")
        if self.num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {self.num_pages}")
        if self.event_delay_s is not None and self.event_delay_s < 0:
            raise ValueError(f"event_delay_s must be >= 0 or None, got {self.event_delay_s}")
        if self.event_delay_s is None and not self.optimistic_index:
            raise ValueError("with no KV events and no optimistic index the router sees nothing")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["timing"] = self.timing.to_dict()
        return d


class Simulator:
    def __init__(self, workload: Workload, policy: Policy | str, config: SimConfig | None = None):
        self.workload = workload
        self.config = config or SimConfig()
        if isinstance(policy, str):
            policy = make_policy(policy, seed=self.config.seed)
        self.policy = policy

    def run(self, progress: bool | str = False) -> RunResult:
        cfg = self.config
        wl = self.workload
        P = cfg.page_size
        policy = self.policy
        hashes = wl.block_hashes(P)
        index = ApproxIndex(P, cfg.index_max_blocks or cfg.num_pages)
        records: list[RequestRecord | None] = [None] * len(wl.requests)
        pos_of = {r.rid: i for i, r in enumerate(wl.requests)}
        finished = [0] * len(wl.requests)

        def on_first_token(st: ReqState, now: float) -> None:
            rec = records[pos_of[st.req.rid]]
            rec.first_token = now
            rec.cached = st.cached

        def on_finish(st: ReqState, now: float) -> None:
            i = pos_of[st.req.rid]
            finished[i] += 1
            rec = records[i]
            rec.finish = now
            policy.on_complete(st.req.rid, rec.worker, st.cached)

        emit = cfg.event_delay_s is not None
        workers = [
            SimWorker(
                w, cfg.num_pages, P, cfg.timing, wl, cfg.eviction, emit, on_first_token, on_finish
            )
            for w in range(cfg.num_workers)
        ]
        for w in workers:
            index.add_worker(w.worker_id)
        heap: list = []
        seq = 0
        delay = cfg.event_delay_s or 0.0
        mem_peak = 0
        steps = 0
        bar = None
        if progress:
            from tqdm.auto import tqdm

            label = progress if isinstance(progress, str) else policy.name
            bar = tqdm(total=len(wl.requests), desc=label, unit="req", leave=False)

        def after_step(w: SimWorker, dt: float | None, now: float) -> None:
            nonlocal seq, steps
            if emit:
                evs = w.cache.take_events()
                if evs:
                    seq += 1
                    if delay:
                        heapq.heappush(heap, (now + delay, 0, seq, _EVENTS, w.worker_id, evs))
                    else:
                        index.apply(w.worker_id, evs)
            if dt is not None:
                seq += 1
                heapq.heappush(heap, (now + dt, 0, seq, _STEP, w.worker_id, None))
            steps += 1
            if cfg.check_every and steps % cfg.check_every == 0:
                for x in workers:
                    x.check_integrity()

        t0 = time.perf_counter()
        reqs = wl.requests
        n = len(reqs)
        i = 0
        optimistic = cfg.optimistic_index
        while i < n or heap:
            if heap and (i >= n or heap[0][0] <= reqs[i].arrival):
                now, _, _, kind, wid, payload = heapq.heappop(heap)
                if kind == _STEP:
                    w = workers[wid]
                    after_step(w, w.step_end(now), now)
                else:
                    index.apply(wid, payload)
                continue
            req = reqs[i]
            hs = hashes[i]
            now = req.arrival
            rreq = RoutingRequest(req.rid, req.num_tokens, hs, req.session, now)
            # One timing model, one performance class: the router pools the workers' fits.
            fit = fit_moments(sum_moments(w.prefill_cost.moments for w in workers))
            decision = policy.choose(rreq, [w.state(fit) for w in workers], index)
            wid = decision.worker_id
            records[i] = RequestRecord(
                req.rid, wid, now, req.num_tokens, decision.predicted_cached_tokens, decision.reason
            )
            if optimistic and hs:
                index.insert(wid, hs)
            policy.on_dispatch(decision, rreq)
            w = workers[wid]
            after_step(w, w.enqueue(req, hs, now), now)
            i += 1
            if i % 1024 == 0:
                mem_peak = max(mem_peak, index.memory_bytes())
            if bar is not None and i % 256 == 0:
                bar.update(256)
        if bar is not None:
            bar.update(n - bar.n)
            bar.close()
        wall = time.perf_counter() - t0
        for w in workers:
            w.check_integrity()
        bad = [reqs[k].rid for k in range(n) if finished[k] != 1]
        if bad:
            raise AssertionError(f"{len(bad)} requests did not finish exactly once: {bad[:10]}")
        mem = index.memory_bytes()
        ceil_hit, _ = ceiling(wl, P)
        return RunResult(
            policy=policy.name,
            records=records,
            busy_time=[w.busy_time for w in workers],
            first_block_tokens=wl.first_block_tokens,
            ceiling_tokens=ceil_hit,
            index_memory_bytes=mem,
            index_memory_peak_bytes=max(mem, mem_peak),
            wall_s=wall,
            config={**cfg.to_dict(), "workload": wl.name, **wl.description},
            oversize=sum(w.oversize for w in workers),
        )


def simulate(
    workload: Workload,
    policy: Policy | str,
    config: SimConfig | None = None,
    progress: bool | str = False,
) -> RunResult:
    """Run one policy over one workload; see :class:`SimConfig` for the cluster."""
    return Simulator(workload, policy, config).run(progress)
