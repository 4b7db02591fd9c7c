"""A simulated worker: the engine's own ``Scheduler`` over a real RadixCache and page allocator,
with a timing model in place of the model.

What differs from a live engine is only what the model would have done: a step's duration comes
from ``TimingModel.step_time`` of the step's shape (``Batch.shape``, the same terms the engine
logs), and the sampled tokens are made up (a chat answer is the workload's answer segment, so
that the next turn's prompt can hit it; other outputs are ids no prompt uses). Admission order,
chunked prefill, in-flight dedupe, page allocation, eviction, preemption and what is cached when
are the engine's, by construction: a change to the scheduler shows here.

With ``host_pages`` the cache has the engine's host tier (docs/host_tier.md): device eviction
demotes, admission loads back. The copies the cache records have no tensors here: each step is
charged their time (``TimingModel.copy_time`` of the bytes, both directions, as the engine runs
them before its forward) on top of its forward.

The simulator calls ``enqueue`` and ``step_end``; both return the duration of the step they
started (None: the worker is idle, or already in a step).
"""

from __future__ import annotations

from collections.abc import Callable

from radixray.cache_index import PageAllocator, RadixCache
from radixray.numbers import Ewma
from radixray.protocol import SamplingParams
from radixray.router.policies import WorkerState
from radixray.step_cost import StepCostModel, decode_seq_seconds
from radixray.worker.packing import fitted_step_costs
from radixray.worker.request import Request
from radixray.worker.scheduler import Batch, Scheduler, SchedulerConfig

from .timing import TimingModel
from .workload import SimRequest, Workload

__all__ = ["SimWorker"]

# Made-up output tokens: int32 ids above any segment's token range (a workload's token table
# is its total prompt length: ~150M tokens for Mooncake at its real scale), distinct per request.
_OUTPUT_BASE = 1 << 30


# Empty schedules in a row, with requests waiting, before a worker counts as stalled: the
# engine would keep scheduling; two suffice after a step that preempted everything.
_EMPTY_RETRIES = 2


class SimWorker:
    # A hybrid's state slots (set by ``_make_cache``: sim/hybrid.py) and checkpoint interval;
    # a model without state layers has none.
    state_slots: PageAllocator | None = None
    state_interval: int = SchedulerConfig.state_interval

    def __init__(
        self,
        worker_id: int,
        num_pages: int,
        page_size: int,
        timing: TimingModel,
        workload: Workload,
        eviction: str = "lru",
        enable_events: bool = True,
        on_first_token: Callable[[SimRequest, int, float], None] | None = None,
        on_finish: Callable[[SimRequest, int, float], None] | None = None,
        prefill_order: str = SchedulerConfig.prefill_order,
        host_pages: int = 0,
        host_write_through_hits: int | None = None,
        packing: str = SchedulerConfig.packing,
    ):
        """``on_first_token(request, cached_tokens, now)`` and ``on_finish(...)`` report each
        request once; ``host_pages`` > 0 gives the cache a host tier of that many pages (and
        ``host_write_through_hits`` its write-through, RadixCache's)."""
        self.worker_id = worker_id
        self.P = page_size
        self.timing = timing
        self.workload = workload
        self.cache = self._make_cache(
            num_pages, eviction, enable_events, host_pages, host_write_through_hits
        )
        self.scheduler = Scheduler(
            self.cache,
            SchedulerConfig(
                max_batch_tokens=timing.max_batch_tokens,
                max_running=timing.max_running,
                prefill_order=prefill_order,
                packing=packing,
                state_interval=self.state_interval,
            ),
            # the engine's rule on the worker's own fits (EngineStats.step_costs)
            step_costs=lambda decodes: fitted_step_costs(
                self.prefill_cost, self.decode_cost, decodes
            ),
            state_slots=self.state_slots,
        )
        self.on_first_token = on_first_token
        self.on_finish = on_finish
        self._sim: dict[str, SimRequest] = {}  # request id -> its workload request
        self._batch: Batch | None = None  # the step in progress
        self._now = 0.0
        # request id -> [start of its first step, forward s, copy s] of the steps up to its
        # first token: where its TTFT went (taken by the simulator with ``take_breakdown``)
        self.breakdown: dict[str, list[float]] = {}
        self.busy_time = 0.0
        self.steps = 0
        self.oversize = 0
        # Measured as the engine measures them (radixray.step_cost), seeded from the timing
        # model as a warm-up benchmark would: a few prefill steps of different sizes.
        self.prefill_cost = StepCostModel()
        for tokens in {max(1, timing.max_batch_tokens // 8), timing.max_batch_tokens}:
            self.prefill_cost.update(tokens, timing.step_time(0, 0, tokens, 0))
        self._decode_step = Ewma(alpha=0.1, initial=timing.step_time(1, 0, 0, 0))
        # decode-only steps against their batch, and the tokens sequences decode (as the engine
        # measures them, EngineStats.decode_cost / answer_tokens; not seeded: the engine has no
        # decode warm-up)
        self.decode_cost = StepCostModel()
        self.answer_tokens = Ewma(1 / 64)
        # The host tier's copies: pages each way, seconds, and the load-back cost fitted to
        # them as the engine fits it (EngineStats.load_cost), seeded the same way.
        self.pages_to_host = 0
        self.pages_from_host = 0
        self.copy_seconds = 0.0
        self.load_cost = StepCostModel()
        if host_pages:
            self.page_bytes = page_size * timing.kv_bytes_per_token
            for pages in (1, 16):
                nbytes = pages * self.page_bytes
                self.load_cost.update(nbytes, timing.copy_time(nbytes))

    def _make_cache(
        self,
        num_pages: int,
        eviction: str,
        enable_events: bool,
        host_pages: int,
        host_write_through_hits: int | None,
    ) -> RadixCache:
        """The engine's RadixCache over ``num_pages`` (sets ``allocator``, ``host_allocator``);
        a subclass builds another of the engine's caches (sim/window.py, sim/hybrid.py)."""
        self.allocator = PageAllocator(num_pages)
        self.host_allocator = PageAllocator(host_pages) if host_pages else None
        return RadixCache(
            self.P,
            self.allocator,
            eviction,
            enable_events=enable_events,
            host_allocator=self.host_allocator,
            host_write_through_hits=host_write_through_hits if host_pages else None,
        )

    @property
    def busy(self) -> bool:
        return self._batch is not None

    @property
    def batch(self) -> Batch | None:
        """The step in progress (None: idle)."""
        return self._batch

    # ------------------------------------------------------------------ state for the router

    def state(
        self, prefill_fit: tuple[float, float] | None = None, decode_seq_s: float | None = None
    ) -> WorkerState:
        """The report a router would see (the engine's load numbers, from the same scheduler).
        ``prefill_fit`` = (overhead_s, tokens_per_s) and ``decode_seq_s`` pooled over the
        workers of this worker's class, as the live router pools them; by default this worker's
        own."""
        overhead, rate = prefill_fit or self.prefill_cost.fit()
        if decode_seq_s is None:
            decode_seq_s = decode_seq_seconds(self.decode_cost.moments) or 0.0
        running, waiting, queued, decoding = self.scheduler.load()
        return WorkerState(
            worker_id=self.worker_id,
            running=running,
            waiting=waiting,
            queued_prefill_tokens=queued,
            active_decode_tokens=decoding,
            free_pages=self.allocator.num_free,
            total_pages=self.allocator.num_pages,
            prefill_tokens_per_s=rate,
            prefill_overhead_s=overhead,
            decode_step_s=self._decode_step.value,
            max_batch_tokens=self.timing.max_batch_tokens,
            decode_seq_s=decode_seq_s,
            answer_tokens=self.answer_tokens.value or 0.0,
            **self._load_report(),
        )

    def _load_report(self) -> dict[str, float]:
        """The host tier's pages and load-back in prompt tokens, as the live router's worker
        pool turns a worker's report into them (``worker_pool._load_cost``); nothing without a
        host tier."""
        host = self.host_allocator
        if not host:
            return {}
        # free host pages and host copies it can drop: room for demotions that loses nothing
        out = {"host_free_pages": self.cache.host_spare_pages, "host_total_pages": host.num_pages}
        fit = self.load_cost.fit()
        if fit is None:
            return out
        overhead, bytes_per_s = fit
        out["load_tokens_per_s"] = bytes_per_s / self.timing.kv_bytes_per_token
        out["load_overhead_s"] = overhead
        return out

    # ------------------------------------------------------------------ requests and steps

    def enqueue(self, req: SimRequest, hashes: list[int], now: float) -> float | None:
        rid = str(req.rid)
        params = SamplingParams(max_tokens=req.output_len, temperature=0.0, ignore_eos=True)
        request = Request(rid, self.workload.tokens(req), params, hashes, arrival_time=now)
        try:
            self.scheduler.add(request)
        except ValueError:  # more than the whole pool: the engine refuses it (a 400)
            self.oversize += 1
            for report in (self.on_first_token, self.on_finish):
                if report:
                    report(req, 0, now)
            return None
        self._sim[rid] = req
        self._now = now
        return None if self.busy else self._start_step()

    def _start_step(self) -> float | None:
        batch = self.scheduler.schedule()
        # A schedule can come back empty with requests waiting: one that preempted every running
        # request admits nobody in the same call. The engine's loop schedules again at once
        # while it has work (an empty step costs it nothing); so does this worker, or it would
        # sit idle with a queue until the next arrival (the window pool's preemptions did).
        for _ in range(_EMPTY_RETRIES):
            if batch.items or not self.scheduler.has_work():
                break
            batch = self.scheduler.schedule()
        if not batch.items:
            return None
        shape = batch.shape()
        dt = self.timing.step_time(*shape)
        self._batch = batch
        self.steps += 1
        # the engine measures its forward alone into these fits, its copies apart
        if shape.prefill_tokens:
            self.prefill_cost.update(shape.prefill_tokens, dt)
        elif shape.decode_batch:
            self._decode_step.update(dt)
            self.decode_cost.update(shape.decode_batch, dt)
        copy = self._copy_time()
        total = self.timing.with_copies(dt, copy)
        self._account(batch, dt, total - dt)
        self.busy_time += total
        return total

    def _account(self, batch: Batch, forward: float, copy: float) -> None:
        """Add a step's forward and (exposed) copy time to the breakdown of every request in
        it that has no first token yet."""
        for it in batch.items:
            if it.req.output_ids:
                continue
            b = self.breakdown.get(it.req.request_id)
            if b is None:
                self.breakdown[it.req.request_id] = [self._now, forward, copy]
            else:
                b[1] += forward
                b[2] += copy

    def _copy_time(self) -> float:
        """Seconds for the demotions and load-backs the cache recorded since the last step (run
        before this step's forward, as the engine runs them)."""
        copies = self.cache.take_copies()
        if not copies:
            return 0.0
        out = sum(len(c.src) for c in copies if c.to_host)
        pages = sum(len(c.src) for c in copies)
        self.pages_to_host += out
        self.pages_from_host += pages - out
        charged = pages if self.timing.charge_demotions else pages - out
        nbytes = charged * self.page_bytes
        t = self.timing.copy_time(nbytes)
        self.copy_seconds += t
        if nbytes:
            self.load_cost.update(nbytes, t)
        return t

    def step_end(self, now: float) -> float | None:
        batch, self._batch = self._batch, None
        self._now = now
        sched = self.scheduler
        sched.postprocess(batch)
        for it in batch.items:
            req = it.req
            if not it.sample or req.finish_reason is not None:
                continue
            sim = self._sim[req.request_id]
            n = len(req.output_ids)
            req.output_ids.append(self._output_token(sim, n))
            if n == 0 and self.on_first_token:
                self.on_first_token(sim, req.cached_tokens, now)
            if n + 1 >= req.params.max_tokens:
                sched.finish(req, "length")
                self.answer_tokens.update(n + 1)
                del self._sim[req.request_id]
                if self.on_finish:
                    self.on_finish(sim, req.cached_tokens, now)
        return self._start_step()

    def _output_token(self, sim: SimRequest, i: int) -> int:
        if sim.output_seg is not None:  # a chat answer: the next turn's prompt repeats it
            return self.workload.output_tokens(sim)[i]
        return _OUTPUT_BASE + (sim.rid * 4096 + i) % _OUTPUT_BASE

    # ------------------------------------------------------------------ checks

    def check_integrity(self) -> None:
        self.scheduler.check_integrity()
