"""The worker engine: schedule -> run -> sample -> emit, over a paged KV pool and a prefix cache.

Three collaborators, one job each:

* ``Engine`` (this module): the core. One step at a time on the caller's thread: requests in,
  ``StreamChunk``s out, stats and KV events. ``generate_batch`` drives it inline.
* ``EngineLoop`` (``engine_loop.py``): a background thread that steps the core, an inbox for
  other threads, and the asyncio bridge behind ``async for chunk in engine.generate(...)``.
* ``RequestBuilder`` (``request_builder.py``): a prompt and its parameters -> a checked request.

State is only ever touched under ``Engine.lock``: inline callers hold it around a step, the loop
thread around each step and each command it applies.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import torch

from radixray.cache_index import make_cache
from radixray.cache_index.events import KVEvent
from radixray.protocol import (
    EngineFailure,
    InvalidRequest,
    LoadReport,
    RequestError,
    SamplingParams,
    StreamChunk,
    WorkerCounters,
)
from radixray.sysinfo import cpu_model

from .config import EngineConfig
from .detokenizer import IncrementalDetokenizer
from .engine_loop import EngineLoop
from .memory_pool import KVPool
from .model_runner import ModelRunner, load_for_engine, resolve_device
from .request import Completion, Request, RequestStatus
from .request_builder import Prompt, RequestBuilder
from .sampler import Sampler
from .scheduler import Batch, Scheduler, SchedulerConfig
from .stats import EngineStats

__all__ = ["Engine", "EngineError", "Sink"]

log = logging.getLogger(__name__)

# Where a request's chunks go as they are produced (on the stepping thread); a failed request
# gets its RequestError instead of a final chunk.
Sink = Callable[[StreamChunk | RequestError], None]
EngineError = EngineFailure  # the engine failed, not the request: another worker may serve it


@dataclass(eq=False)
class _Live:
    """A request the engine is serving: its scheduler state, its text so far, where it goes."""

    req: Request
    detok: IncrementalDetokenizer
    sink: Sink | None = None
    admitted: bool = False
    completion: Completion | None = None
    chunks: list[StreamChunk] = field(default_factory=list)
    queued_at: float = field(default_factory=time.monotonic)  # when the engine took it


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
        self.pool = KVPool.for_model(mcfg, config, self.device, self.max_model_len)
        self.page_size = config.page_size
        cache_kwargs = (
            {"eviction": config.eviction, "enable_events": config.enable_events}
            if config.cache == "radix"
            else {}
        )
        self.cache = make_cache(config.cache, config.page_size, self.pool.allocator, **cache_kwargs)
        self.scheduler = Scheduler(
            self.cache,
            SchedulerConfig(
                max_batch_tokens=config.max_batch_tokens,
                max_running=config.max_running,
                dedupe_in_flight=config.dedupe_in_flight,
                prefill_order=config.prefill_order,
            ),
        )
        self.runner = ModelRunner(model, self.pool, self.device, config.attention_backend)
        self.sampler = Sampler(config.seed)
        self.requests = RequestBuilder(
            tokenizer, mcfg.vocab_size, self.max_model_len, self.page_size
        )
        self.meter = EngineStats()  # counters, step cost fit, rates
        self._busy_since: float | None = None  # the last step's end, if work was left
        self.lock = threading.RLock()
        self.broken: str | None = None  # why the engine stopped for good (state unknown)
        self._live: dict[str, _Live] = {}
        self._stop_ids = frozenset(tokenizer.stop_token_ids) if tokenizer else frozenset()
        self.loop = EngineLoop(self)

    # ------------------------------------------------------------------ requests

    def add(self, req: Request, sink: Sink | None = None) -> None:
        """Queue a built request; its chunks go to ``sink`` (call with ``lock`` held)."""
        if req.request_id in self._live:
            raise InvalidRequest(f"request_id {req.request_id!r} is already in use", "request_id")
        self.scheduler.add(req)
        decode = (lambda ids: self.tokenizer.decode(ids)) if self.tokenizer else (lambda ids: "")
        self._live[req.request_id] = _Live(
            req, IncrementalDetokenizer(decode, req.params.stop), sink
        )

    def add_request(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        extra_key: str | None = None,
    ) -> str:
        """Queue a request (inline mode: drive it with ``step()``). Returns its id."""
        self.check_alive()
        req = self.requests.build(prompt, params or SamplingParams(), request_id, extra_key)
        with self.lock:
            self.add(req)
        return req.request_id

    def abort_now(self, request_id: str) -> StreamChunk | None:
        """End a request at once and free its pages (call with ``lock`` held)."""
        live = self._live.get(request_id)
        if live is None or self.scheduler.abort(request_id) is None:
            return None
        return self._chunk(live, [], live.detok.flush(live.req.output_ids), "abort")

    # ------------------------------------------------------------------ stepping

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[StreamChunk]:
        """Run one scheduled step; return the chunks it produced. If the step fails, every
        request is ended with an error (its pages freed) before the exception propagates: a
        broken batch must not stay in the queue and fail every later step too."""
        start = time.perf_counter()
        with self.lock:
            self.loop.apply_commands()  # what other threads sent lands at this step boundary
            batch = self.scheduler.schedule()
            if not batch.items:
                self._busy_since = None
                return []
            try:
                return self._run(batch, start)
            except Exception as e:
                self.fail_all(f"engine step failed: {type(e).__name__}: {e}")
                raise

    def _run(self, batch: Batch, start: float) -> list[StreamChunk]:
        for it in batch.items:
            live = self._live[it.req.request_id]
            if not live.admitted:
                live.admitted = True
                self.meter.record_admission(it.req.num_prompt, it.req.miss)
        shape = batch.shape()  # before the step: sampling makes a one-token prefill look decode
        t0 = time.perf_counter()
        logits = self.runner.run(batch)
        dt = time.perf_counter() - t0
        self.scheduler.postprocess(batch)
        out = self._emit(batch, logits)
        end = time.perf_counter()
        # the step's share of the engine's time: from the last step's end if the engine had
        # work since (the loop's own time and any wait for the cores are this step's), else
        # from when this one began
        begin = self._busy_since if self._busy_since is not None else start
        self._busy_since = end if self.scheduler.has_work() else None
        self.meter.record_step(shape, dt, end - begin)
        if self.config.debug_checks:
            self.scheduler.check_integrity()
        return out

    def _emit(self, batch: Batch, logits: torch.Tensor) -> list[StreamChunk]:
        items = [it for it in batch.items if it.sample]
        if not items:
            return []
        reqs = [it.req for it in items]
        tokens = self.sampler.sample(logits, [r.request_id for r in reqs], [r.params for r in reqs])
        now = time.monotonic()
        out = []
        for req, tok in zip(reqs, tokens, strict=True):
            live = self._live[req.request_id]
            req.output_ids.append(tok)
            if req.first_token_time is None:
                req.first_token_time = now
                self.meter.record_first_token(
                    req.num_prompt, req.cached_tokens, now - live.queued_at
                )
            delta = live.detok.update(req.output_ids)
            reason = self._finish_reason(req, tok, live.detok.stopped)
            if reason:
                self.scheduler.finish(req, reason)
                delta += live.detok.flush(req.output_ids)
            out.append(self._chunk(live, [tok], delta, reason))
        return out

    def _finish_reason(self, req: Request, tok: int, stop_string: bool) -> str | None:
        p = req.params
        if stop_string or tok in p.stop_token_ids or (not p.ignore_eos and tok in self._stop_ids):
            return "stop"
        if len(req.output_ids) >= p.max_tokens or req.num_tokens >= self.max_model_len:
            return "length"
        return None

    def _chunk(self, live: _Live, toks: list[int], text: str, reason: str | None) -> StreamChunk:
        req = live.req
        if reason is None:
            chunk = StreamChunk(toks, text, req.cached_tokens)
        else:
            miss = dict(req.miss) if req.miss else {}
            chunk = StreamChunk(
                toks,
                text,
                req.cached_tokens,
                reason,
                req.num_prompt,
                len(req.output_ids),
                miss,
            )
            live.completion = Completion(
                req.request_id,
                live.detok.text,
                list(req.output_ids),
                req.num_prompt,
                req.cached_tokens,
                len(req.output_ids),
                reason,
                miss,
            )
            self.sampler.forget(req.request_id)
            self.meter.requests_finished += 1
            self.meter.completion_tokens += len(req.output_ids)
            if reason == "abort":
                self.meter.requests_aborted += 1
            del self._live[req.request_id]
        if live.sink is not None:
            live.sink(chunk)
        return chunk

    def fail_all(self, message: str) -> None:
        """End every request with an engine failure and free its pages. If freeing fails too,
        the engine's state is unknown: it marks itself ``broken`` (the loop stops, health says
        so, new requests are refused) rather than keep failing every step."""
        with self.lock:
            for rid, live in list(self._live.items()):
                if self.broken is None and live.req.status is not RequestStatus.FINISHED:
                    try:
                        self.scheduler.abort(rid)
                    except Exception as e:
                        log.exception("could not free request %s after a failed step", rid)
                        self.broken = (
                            f"freeing request {rid} after a failed step raised "
                            f"{type(e).__name__}: {e}"
                        )
                del self._live[rid]
                if live.sink is not None:
                    live.sink(EngineFailure(message))

    # ------------------------------------------------------------------ public API

    def generate_batch(
        self,
        prompts: Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        extra_keys: Sequence[str | None] | None = None,
    ) -> list[Completion]:
        """Submit all prompts together (they share batches) and run until all finish."""
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
        if self.loop.running:
            return self.loop.run_batch(reqs)
        with self.lock:
            for r in reqs:
                self.add(r)
            lives = [self._live[r.request_id] for r in reqs]
            while any(x.completion is None for x in lives):
                self.step()
        return [x.completion for x in lives]

    async def generate(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        extra_key: str | None = None,
    ) -> AsyncIterator[StreamChunk]:
        """Stream a request's chunks (the loop thread runs it; see ``EngineLoop.stream``).
        Leaving early (break, cancellation, client disconnect) aborts it and frees its pages."""
        req = self.requests.build(prompt, params or SamplingParams(), request_id, extra_key)
        stream = self.loop.stream(req)
        try:
            async for chunk in stream:
                yield chunk
        finally:
            await stream.aclose()

    def abort(self, request_id: str) -> None:
        """Abort a request wherever it is; its pages are freed at the next step boundary (at
        once when no loop thread runs)."""
        if self.loop.running:
            self.loop.abort(request_id)
        else:
            with self.lock:
                self.abort_now(request_id)

    def start(self) -> None:
        """Start the background loop thread (idempotent)."""
        self.loop.start()

    def shutdown(self) -> None:
        self.loop.shutdown()

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
        """KV events since the last call (in order)."""
        with self.lock:
            return self.cache.take_events()

    def snapshot_events(self) -> list[KVEvent]:
        """``AllBlocksCleared`` and every cached chain as stored events: the cache as it is."""
        with self.lock:
            return self.cache.snapshot_events()

    def check_integrity(self) -> None:
        with self.lock:
            self.scheduler.check_integrity()

    @property
    def perf_class(self) -> str:
        """What sets this worker's speed: workers that share it run at the same speed, so a
        router pools their step-time measurements instead of routing on the noise between them.
        """
        dev = self.device
        if dev.type == "cuda":
            hw = torch.cuda.get_device_name(dev)
        else:
            hw = f"{cpu_model()} x{torch.get_num_threads()} threads"
        c = self.config
        return " | ".join((c.model, c.dtype, hw, self.runner.attention.name))

    def stats(self) -> dict:
        """Counters, load and measured rates in one dict (keys: ``WorkerCounters`` and
        ``LoadReport`` fields, plus ``page_size``)."""
        s = self.meter.as_dict()
        sched, alloc = self.scheduler, self.pool.allocator
        running, waiting, queued, decoding = sched.load()
        s.update(
            running=running,
            # Requests still in the inbox are waiting too: they are accepted, not yet queued.
            waiting=waiting + self.loop.pending,
            queued_prefill_tokens=queued,
            active_decode_tokens=decoding,
            free_pages=alloc.num_free,
            total_pages=alloc.num_pages,
            cached_pages=self.cache.total_tokens // self.page_size,
            evictable_pages=self.cache.evictable_tokens // self.page_size,
            page_size=self.page_size,
            preemptions=sched.num_preemptions,
            evicted_pages=sched.num_evicted_pages,
        )
        return s

    def report(self) -> tuple[LoadReport, WorkerCounters]:
        """The load and the counters a worker sends in its poll result."""
        s = self.stats()
        load = LoadReport(**{k: s[k] for k in LoadReport.__struct_fields__ if k in s})
        counters = WorkerCounters(**{k: s[k] for k in WorkerCounters.__struct_fields__})
        return load, counters

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
