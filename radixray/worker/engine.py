"""The worker engine: schedule -> run -> sample -> emit, over a paged KV pool and a prefix cache.

Three collaborators, one job each:

* ``Engine`` (this module): the core. ``add``, ``step``, ``abort``: requests in, ``StreamChunk``s
  out (to each request's sink), stats and KV events. No lock: single-threaded by contract.
* ``EngineLoop`` (``engine_loop.py``): the core's only driver. Its ``turn`` (the inbox's
  commands, then one ``step``) runs on its thread while that runs, else on the caller's thread
  (``generate_batch``); the asyncio bridge behind ``async for chunk in engine.generate(...)``.
* ``RequestBuilder`` (``request_builder.py``): a prompt and its parameters -> a checked request.

Who may touch the core: the loop's thread while it runs, else whoever calls (``add_request`` and
``step`` by hand, as tests and benchmarks do). Other threads go through the loop (``submit``,
``abort``, ``call``); the read-outs below (events, integrity) do so themselves.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Sequence

import torch

from radixray.cache_index.events import KVEvent
from radixray.protocol import (
    EngineFailure,
    InvalidRequest,
    LoadReport,
    SamplingParams,
    StreamChunk,
    WorkerCounters,
)

from .detokenizer import Detokenizers
from .emit import take_all
from .engine_config import EngineConfig
from .engine_loop import EngineLoop
from .live import Live, LiveRequests, Sink
from .logprobs import keep_prompt_logprobs, token_logprobs
from .memory_pool import KVPool, cache_kind
from .model_runner import ModelRunner, load_for_engine, resolve_device
from .overlap import OverlapStepper
from .request import Completion, CompletionBuilder, Request, RequestStatus
from .request_builder import Prompt, RequestBuilder
from .sampler import Sampler
from .samples import expand_mask
from .scheduler import Batch, Scheduler
from .state_pool import state_pool_for
from .stats import EngineStats, engine_stats, perf_class, worker_report
from .structured import StructuredOutput

__all__ = ["Engine", "EngineError", "Sink"]

log = logging.getLogger(__name__)

EngineError = EngineFailure  # the engine failed, not the request: another worker may serve it


class Engine:
    def __init__(self, config: EngineConfig | None = None, loaded=None):
        """``loaded``: an already loaded (model, model_config, tokenizer) to share between
        engines (tests); by default the model named in the config is loaded."""
        self.config = config = config or EngineConfig()
        self.device = resolve_device(config.device)
        if config.cpu_threads is not None and self.device.type == "cpu":
            torch.set_num_threads(config.cpu_threads)
        model, mcfg, tokenizer = loaded or load_for_engine(config, self.device)
        self.model_config = mcfg
        self.tokenizer = tokenizer
        self.max_model_len = min(
            config.max_model_len or mcfg.max_position_embeddings, mcfg.max_position_embeddings
        )
        self.cache_kind = cache_kind(config.cache, mcfg)
        self.pool = KVPool.for_model(mcfg, config, self.device, self.max_model_len, self.cache_kind)
        self.page_size = config.page_size
        self.state_pool = state_pool_for(mcfg, config, self.device)  # a hybrid's, else None
        slots = self.state_pool.allocator if self.state_pool else None
        self.cache = self.pool.make_cache(self.cache_kind, config, self.state_pool)
        self.meter = EngineStats()  # counters, step cost fit, rates
        self.scheduler = Scheduler(self.cache, config.scheduler(), self.meter.step_costs, slots)
        self.runner = ModelRunner(
            model, self.pool, self.device, config.attention_backend, self.state_pool
        )
        graph_batch = min(config.cuda_graph_max_batch, config.max_running)
        self.runner.use_graphs(graph_batch, self.max_model_len)  # CUDA: decode replays graphs
        # the tokenizer's, else what the checkpoint declares (every eos_token_id)
        stop_ids = frozenset(tokenizer.stop_token_ids if tokenizer else mcfg.stop_token_ids)
        self.sampler = Sampler(config.seed, stop_ids)
        self.requests = RequestBuilder(
            tokenizer, mcfg.vocab_size, self.max_model_len, self.page_size
        )
        self._busy_since: float | None = None  # the last step's end, if work was left
        self.broken: str | None = None  # why the engine stopped for good (state unknown)
        self._live = LiveRequests(self.meter, self.sampler)  # what it serves, by sample id
        self._stop_ids = stop_ids
        self._detokenizer = Detokenizers(tokenizer, mcfg.vocab_size)  # a request's text
        self.structured = StructuredOutput(tokenizer, mcfg.vocab_size)
        self.loop = EngineLoop(self)
        self.overlap = OverlapStepper(self, self.device) if config.overlapped(self.device) else None

    # ------------------------------------------------------------------ the core

    def add(self, req: Request, sink: Sink | None = None) -> None:
        """Queue a built request; its chunks go to ``sink`` (on the driving thread)."""
        if req.request_id in self._live:
            raise InvalidRequest(f"request_id {req.request_id!r} is already in use", "request_id")
        matcher = self.structured.matcher(req.params.grammar)  # a bad grammar is a 400 here
        self.scheduler.add(req)
        self._live.add(Live(req, self._detokenizer(req), sink, matcher=matcher))

    def add_request(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        extra_key: str | None = None,
    ) -> str:
        """Build and queue a request on the driving thread (drive it with ``step()``; while the
        loop's thread runs, use ``generate`` instead). Returns its id."""
        self.check_alive()
        req = self.requests.build(prompt, params or SamplingParams(), request_id, extra_key)
        self.add(req)
        return req.request_id

    def abort(self, request_id: str) -> StreamChunk | None:
        """End a request (every sample) at once and free its pages (on the driving thread; from
        any other thread use ``loop.abort``, applied at the next step boundary). Returns its
        final chunk, or None if it was not running here."""
        last = None
        for live in self._live.samples(request_id):
            if self.scheduler.abort(live.req.request_id) is not None:
                last = self._live.end(live, [], live.detok.flush(live.req.output_ids), "abort")
        if not self.scheduler.has_work():
            self._busy_since = None
            if self.overlap is not None:
                self.overlap.drain()  # only ended requests' rows are on the device: dropped
        return last

    def has_work(self) -> bool:
        return self.scheduler.has_work() or bool(self.overlap and self.overlap.inflight)

    def step(self) -> list[StreamChunk]:
        """Run one scheduled step; return the chunks it produced (overlapped: launch one step
        and return the chunks of the one before, ``overlap.py``). If the step fails, every
        request is ended with an error (its pages freed) before the exception propagates: a
        broken batch must not stay in the queue and fail every later step too."""
        start = time.perf_counter()
        try:
            if self.overlap is not None:
                out = self.overlap.step(start)
            else:
                batch = self.scheduler.schedule()
                out = self._run(batch, start) if batch.items else []
            if not self.has_work():
                self._busy_since = None
            return out
        except Exception as e:
            self.fail_all(f"engine step failed: {type(e).__name__}: {e}")
            raise

    def _run(self, batch: Batch, start: float, copies=None) -> list[StreamChunk]:
        """One step, serially. ``copies``: host-tier copies already taken from the cache."""
        self._note_admitted(batch)
        shape = batch.shape()  # before the step: sampling makes a one-token prefill look decode
        masks = None  # computed on a helper thread during the forward
        if self._live.ruled:
            live = self._live
            ruled = [live[it.req.request_id].matcher for it in batch.items if it.sample]
            masks = self.structured.start_masks(ruled)
        # the schedule's demotions and load-backs: by layer in the forward, or all first for a
        # graph replay (one launch: CUDA event waits, no host sync; eager was ~10x slower)
        self._run_copies(layered=not self.runner.replays(batch), copies=copies)
        t0 = time.perf_counter()
        logits = self.runner.run(batch)
        dt = time.perf_counter() - t0 - self._run_copies()  # the forward, less its copies
        self.scheduler.postprocess(batch)
        keep_prompt_logprobs(self.runner.prompt_logits, self._live)
        out = self._emit(batch, logits, masks)
        self._record_step(shape, dt, start)
        return out

    def _note_admitted(self, batch: Batch) -> None:
        for it in batch.items:
            if it.start >= len(it.req.prompt_ids):
                continue  # past its prompt: admitted in an earlier step
            live = self._live[it.req.request_id]
            if not live.admitted:
                live.admitted = True
                self.meter.record_admission(it.req.num_prompt, it.req.miss)

    def _record_step(self, shape, forward_s: float, start: float) -> None:
        """A step's timing: its share of the engine's time runs from the last step's end if the
        engine had work since (the loop's own time and any wait for the cores are this step's),
        else from when this one began."""
        end = time.perf_counter()
        begin = self._busy_since if self._busy_since is not None else start
        self._busy_since = end if self.has_work() else None
        # (overlapped, a forward can outlast the time between two reads: it began before)
        self.meter.record_step(shape, forward_s, max(end - begin, forward_s))
        if self._busy_since is None:  # idle: the copies' timings, waited for (no one waits)
            self._run_copies(wait=True)
        if self.config.debug_checks:
            self.scheduler.check_integrity()

    def _emit(self, batch: Batch, logits: torch.Tensor, masks=None) -> list[StreamChunk]:
        reqs = [it.req for it in batch.items if it.sample]
        if not reqs:
            return []
        grammar = self.structured.sampler_kwargs(masks)
        if self._live.groups:  # forks sample their first token from their leader's row
            n = len(reqs)
            rows, reqs = self._fork(reqs)
            if len(reqs) > n:
                logits = logits[torch.tensor(rows, device=logits.device)]
                if grammar:
                    grammar["grammar_mask"] = expand_mask(grammar["grammar_mask"], rows, n)
        tokens = self.sampler.sample_requests(logits, reqs, **grammar)
        if self._live.lps:  # (else no row asks: no pass over the rows for it)
            lps = token_logprobs(logits, [r.params.logprobs for r in reqs], tokens)
        else:
            lps = [None] * len(tokens)
        return take_all(self, self._live.of(reqs), tokens, lps, time.monotonic())

    def _fork(self, reqs: list[Request]) -> tuple[list[int], list[Request]]:
        """Start the other samples of each leader in ``reqs`` sampling its first token
        (``samples.py``). Returns each sampled request's logits row and the requests, forks
        (the ones that got pages now) appended."""
        rows, out, copies = list(range(len(reqs))), list(reqs), []
        matcher = self.structured.matcher
        for row, req in enumerate(reqs):
            for f in self._live.fork(self._live[req.request_id], self._detokenizer, matcher):
                pairs = self.scheduler.fork(req, f)
                if pairs is not None:
                    self._run_copies()  # what its allocation demoted is copied out before reuse
                    self.runner.fork_state(req, f)  # its own copy of the leader's state
                    copies += pairs
                    rows.append(row)
                    out.append(f)
        self.pool.copy_pages(copies)
        return rows, out

    def _run_copies(self, layered: bool = False, wait: bool = False, copies=None) -> float:
        """Hand the page copies the cache recorded (host tier) to the pool, in order: run now,
        or (``layered``) by the next forward, layer ``i``'s just before layer ``i``
        (``host_copies.py``); count those done (CUDA: whose copy stream is done, or ``wait``
        for it). Returns the seconds the last forward spent on them (its ``before_layer``)."""
        copies = (copies or []) + self.cache.take_copies()
        done, held = self.pool.host_copies(copies, layered, wait)
        for copies, moved, seconds in done:
            self.meter.record_copies(copies, moved, seconds)
        return held

    def fail_all(self, message: str) -> None:
        """End every request with an engine failure and free its pages. If freeing fails too,
        the engine's state is unknown: it marks itself ``broken`` (the loop stops, health says
        so, new requests are refused) rather than keep failing every step."""
        if self.overlap is not None:
            self.overlap.inflight = None  # its ids are never read: every request ends here
        told: set[int] = set()  # the samples of a request share its sink: tell it once
        for rid, live in self._live.clear():
            self.sampler.forget(rid)
            if self.broken is None and live.req.status is not RequestStatus.FINISHED:
                try:
                    self.scheduler.abort(rid)
                except Exception as e:
                    log.exception("could not free request %s after a failed step", rid)
                    self.broken = (
                        f"freeing request {rid} after a failed step raised {type(e).__name__}: {e}"
                    )
            if live.sink is not None and id(live.sink) not in told:
                told.add(id(live.sink))
                live.sink(EngineFailure(message))

    # ------------------------------------------------------------------ public API

    def generate_batch(
        self,
        prompts: Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        extra_keys: Sequence[str | None] | None = None,
    ) -> list[Completion]:
        """Submit all prompts together (they share batches) and run until all finish: on the
        loop's thread while it runs, else on this one (the loop's own ``turn``, run here).
        One completion per prompt and sample, in order (prompt i's sample j at i * n + j)."""
        self.check_alive()
        params = params or SamplingParams()
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"got {len(plist)} SamplingParams for {len(prompts)} prompts")
        keys = list(extra_keys) if extra_keys is not None else [None] * len(prompts)
        reqs = [
            self.requests.build(p, sp, None, k)
            for p, sp, k in zip(prompts, plist, keys, strict=True)
        ]
        builders = [CompletionBuilder(r.request_id) for r in reqs]
        self.loop.run(zip(reqs, builders, strict=True))
        return [c for b in builders for c in b.results()]

    def generate(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        extra_key: str | None = None,
    ) -> AsyncIterator[StreamChunk]:
        """A request's chunks, streamed by the loop's thread (``EngineLoop.stream``; a bad
        request raises here). Leaving early (break, cancellation, client disconnect) aborts it
        and frees its pages."""
        req = self.requests.build(prompt, params or SamplingParams(), request_id, extra_key)
        return self.loop.stream(req)

    def start(self) -> None:
        """Start the background loop thread (idempotent)."""
        self.loop.start()

    def shutdown(self) -> None:
        self.loop.shutdown()
        if self.overlap is not None:
            self.overlap.close()

    @property
    def alive(self) -> bool:
        """False once a failure left the engine in an unknown state (it serves nothing more),
        or when its loop thread died."""
        return self.broken is None and self.loop.healthy

    def check_alive(self) -> None:
        """Raise EngineFailure if the engine cannot serve (see ``alive``)."""
        if self.broken:
            raise EngineFailure(f"engine stopped: {self.broken}")
        if not self.loop.healthy:
            raise EngineFailure("engine loop thread is not running")

    # ------------------------------------------------------------------ introspection

    def take_events(self) -> list[KVEvent]:
        """KV events since the last call (in order). Any thread: read at a step boundary."""
        return self.loop.call(self.cache.take_events)

    def snapshot_events(self) -> list[KVEvent]:
        """``AllBlocksCleared`` and every cached chain as stored events: the cache as it is.
        Any thread: read at a step boundary."""
        return self.loop.call(self.cache.snapshot_events)

    def check_integrity(self) -> None:
        """Raise if a page invariant is broken. Any thread: checked at a step boundary."""
        self.loop.call(self.scheduler.check_integrity)

    @property
    def perf_class(self) -> str:
        """What sets this worker's speed (``worker.stats.perf_class``)."""
        return perf_class(self.config, self.device, self.runner.attention.name)

    def stats(self) -> dict:
        """Counters, load and measured rates in one dict (``stats.engine_stats``)."""
        return engine_stats(self)

    def report(self) -> tuple[LoadReport, WorkerCounters]:
        """The load and the counters a worker sends in its poll result."""
        return worker_report(self.stats())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
