"""The worker engine: schedule -> run -> sample -> emit, over a paged KV pool and a prefix cache.

Two ways to drive it:

* ``generate_batch(prompts, params)`` submits everything at once and steps inline until all are
  done (tests, benchmarks, offline use).
* ``async for chunk in generate(prompt, params, request_id)`` streams; a background thread runs
  the loop so that the forward pass never blocks the caller's event loop. ``abort`` (or leaving
  the ``async for`` early) frees the request's pages at the next step boundary.

Commands from other threads go through an inbox that only the loop drains, so the scheduler's
state is only ever touched by one thread at a time.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import torch

from radixray.cache_index import hash_blocks, make_cache
from radixray.cache_index.events import KVEvent
from radixray.sysinfo import cpu_model

from .config import EngineConfig
from .detokenizer import IncrementalDetokenizer
from .memory_pool import KVPool
from .model_runner import ModelRunner, load_for_engine
from .request import Completion, Request, RequestStatus, SamplingParams
from .sampler import Sampler
from .scheduler import Batch, Scheduler, SchedulerConfig
from .stats import EngineStats

__all__ = ["Engine", "EngineError", "GenerationChunk"]

log = logging.getLogger(__name__)
Prompt = str | Sequence[int]


@dataclass(frozen=True)
class GenerationChunk:
    """One streamed piece. The final chunk has ``finish_reason`` set and carries the usage and
    the miss breakdown."""

    request_id: str
    token_ids: list[int]
    text: str
    finish_reason: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    miss: dict[str, int] | None = None
    error: str | None = None
    # "invalid_request": this request was refused (the client's fault, do not retry);
    # "engine": the engine failed while running it (the worker's fault: retry elsewhere).
    error_type: str | None = None


class EngineError(RuntimeError):
    """The engine failed, not the request: another worker may well serve it."""


@dataclass(eq=False)
class _Tracked:
    req: Request
    detok: IncrementalDetokenizer
    sink: Callable[[GenerationChunk], None] | None = None
    admitted: bool = False
    completion: Completion | None = None
    chunks: list[GenerationChunk] = field(default_factory=list)


class Engine:
    def __init__(self, config: EngineConfig | None = None, loaded=None):
        """``loaded``: an already loaded (model, model_config, tokenizer) to share between
        engines (tests); by default the model named in the config is loaded."""
        self.config = config = config or EngineConfig()
        self.device = _resolve_device(config.device)
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
            ),
        )
        self.runner = ModelRunner(model, self.pool, self.device, config.attention_backend)
        self.sampler = Sampler(config.seed)
        self.stats_ = EngineStats()
        self._tracked: dict[str, _Tracked] = {}
        self._ids = itertools.count()
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._broken: str | None = None  # why the engine stopped for good (state unknown)
        self._stop_ids = frozenset(tokenizer.stop_token_ids) if tokenizer else frozenset()

    # ------------------------------------------------------------------ requests

    def _make_request(
        self,
        prompt: Prompt,
        params: SamplingParams,
        request_id: str | None,
        extra_key: str | None,
    ) -> Request:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer: pass token ids")
            ids = self.tokenizer.encode(prompt)
        else:
            ids = list(prompt)
            vocab = self.model_config.vocab_size
            for t in ids:
                if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
                    raise ValueError(f"prompt token ids must be ints in [0, {vocab}), got {t!r}")
        if not ids:
            raise ValueError("prompt must not be empty")
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"prompt is {len(ids)} tokens; the context length is {self.max_model_len}"
            )
        room = self.max_model_len - len(ids)
        if params.max_tokens > room:
            # Generation stops at the context length anyway ("length"); size the request so.
            params = _replace(params, max_tokens=room)
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        return Request(
            request_id=rid,
            prompt_ids=ids,
            params=params,
            block_hashes=hash_blocks(ids, self.page_size, extra_key=extra_key),
            extra_key=extra_key,
            arrival_time=time.monotonic(),
        )

    def _add(self, req: Request, sink=None) -> _Tracked:
        if req.request_id in self._tracked:
            raise ValueError(f"request_id {req.request_id!r} is already in use")
        self.scheduler.add(req)
        decode = (lambda ids: self.tokenizer.decode(ids)) if self.tokenizer else (lambda ids: "")
        tr = _Tracked(req, IncrementalDetokenizer(decode, req.params.stop), sink)
        self._tracked[req.request_id] = tr
        return tr

    def add_request(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        extra_key: str | None = None,
    ) -> str:
        """Queue a request (inline mode: drive it with ``step()``). Returns its id."""
        self.check_alive()
        req = self._make_request(prompt, params or SamplingParams(), request_id, extra_key)
        with self._lock:
            self._add(req)
        return req.request_id

    # ------------------------------------------------------------------ the loop

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[GenerationChunk]:
        """Run one scheduled step; return the chunks it produced. If the step fails, every
        request is ended with an error (its pages freed) before the exception propagates: a
        broken batch must not stay in the queue and fail every later step too."""
        with self._lock:
            self._drain_inbox()
            batch = self.scheduler.schedule()
            if not batch.items:
                return []
            try:
                return self._run(batch)
            except Exception as e:
                self._fail_all(f"engine step failed: {type(e).__name__}: {e}")
                raise

    def _run(self, batch: Batch) -> list[GenerationChunk]:
        for it in batch.items:
            tr = self._tracked[it.req.request_id]
            if not tr.admitted:
                tr.admitted = True
                self.stats_.record_admission(it.req.num_prompt, it.req.miss)
        t0 = time.perf_counter()
        logits = self.runner.run(batch)
        dt = time.perf_counter() - t0
        self.scheduler.postprocess(batch)
        out = self._emit(batch, logits)
        decode = sum(1 for it in batch.items if it.num_tokens == 1 and it.req.output_ids)
        self.stats_.record_step(batch.num_tokens - decode, decode, dt)
        if self.config.debug_checks:
            self.scheduler.check_integrity()
        return out

    def _emit(self, batch: Batch, logits: torch.Tensor) -> list[GenerationChunk]:
        items = [it for it in batch.items if it.sample]
        if not items:
            return []
        reqs = [it.req for it in items]
        tokens = self.sampler.sample(logits, [r.request_id for r in reqs], [r.params for r in reqs])
        now = time.monotonic()
        out = []
        for req, tok in zip(reqs, tokens, strict=True):
            tr = self._tracked[req.request_id]
            req.output_ids.append(tok)
            if req.first_token_time is None:
                req.first_token_time = now
            delta = tr.detok.update(req.output_ids)
            reason = self._finish_reason(req, tok, tr.detok.stopped)
            if reason:
                self.scheduler.finish(req, reason)
                delta += tr.detok.flush(req.output_ids)
            out.append(self._chunk(tr, [tok], delta, reason))
        return out

    def _finish_reason(self, req: Request, tok: int, stop_string: bool) -> str | None:
        p = req.params
        if stop_string or tok in p.stop_token_ids or (not p.ignore_eos and tok in self._stop_ids):
            return "stop"
        if len(req.output_ids) >= p.max_tokens or req.num_tokens >= self.max_model_len:
            return "length"
        return None

    def _chunk(self, tr: _Tracked, toks: list[int], text: str, reason: str | None):
        req = tr.req
        if reason is None:
            # cached_tokens is known from admission on: every chunk carries it, so a router can
            # put it in response headers as soon as the first token arrives.
            chunk = GenerationChunk(req.request_id, toks, text, cached_tokens=req.cached_tokens)
        else:
            miss = dict(req.miss) if req.miss else None
            chunk = GenerationChunk(
                req.request_id,
                toks,
                text,
                reason,
                req.num_prompt,
                req.cached_tokens,
                len(req.output_ids),
                miss,
            )
            tr.completion = Completion(
                req.request_id,
                tr.detok.text,
                list(req.output_ids),
                req.num_prompt,
                req.cached_tokens,
                len(req.output_ids),
                reason,
                miss or {},
            )
            self.sampler.forget(req.request_id)
            self.stats_.requests_finished += 1
            self.stats_.completion_tokens += len(req.output_ids)
            if reason == "abort":
                self.stats_.requests_aborted += 1
            del self._tracked[req.request_id]
        if tr.sink is not None:
            tr.sink(chunk)
        return chunk

    def _abort_now(self, request_id: str) -> GenerationChunk | None:
        tr = self._tracked.get(request_id)
        if tr is None or self.scheduler.abort(request_id) is None:
            return None
        return self._chunk(tr, [], tr.detok.flush(tr.req.output_ids), "abort")

    def _drain_inbox(self) -> None:
        while True:
            try:
                cmd, arg = self._inbox.get_nowait()
            except queue.Empty:
                return
            if cmd == "add":
                req, sink = arg
                if self._broken:
                    sink(self._error_chunk(req.request_id, f"engine stopped: {self._broken}"))
                    continue
                try:
                    self._add(req, sink)
                except ValueError as e:
                    sink(
                        GenerationChunk(
                            req.request_id,
                            [],
                            "",
                            "error",
                            error=str(e),
                            error_type="invalid_request",
                        )
                    )
            elif cmd == "abort":
                self._abort_now(arg)

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
            self._make_request(p, sp, None, k)
            for p, sp, k in zip(prompts, plist, keys, strict=True)
        ]
        if self._thread is not None:
            return self._generate_batch_threaded(reqs)
        with self._lock:
            tracked = [self._add(r) for r in reqs]
            while any(t.completion is None for t in tracked):
                self.step()
        return [t.completion for t in tracked]

    def _generate_batch_threaded(self, reqs: list[Request]) -> list[Completion]:
        done = threading.Semaphore(0)
        texts: dict[str, list[str]] = {r.request_id: [] for r in reqs}
        tokens: dict[str, list[int]] = {r.request_id: [] for r in reqs}
        final: dict[str, GenerationChunk] = {}

        def sink(c: GenerationChunk) -> None:  # runs on the loop thread
            texts[c.request_id].append(c.text)
            tokens[c.request_id] += c.token_ids
            if c.finish_reason:
                final[c.request_id] = c
                done.release()

        for r in reqs:
            self._inbox.put(("add", (r, sink)))
        self._wake.set()
        self._refuse_if_stopped()
        for _ in reqs:
            done.acquire()
        out = []
        for r in reqs:
            c = final[r.request_id]
            if c.error:
                raise _chunk_error(c)
            out.append(
                Completion(
                    r.request_id,
                    "".join(texts[r.request_id]),
                    tokens[r.request_id],
                    c.prompt_tokens,
                    c.cached_tokens,
                    c.completion_tokens,
                    c.finish_reason,
                    c.miss or {},
                )
            )
        return out

    async def generate(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        extra_key: str | None = None,
    ) -> AsyncIterator[GenerationChunk]:
        """Stream a request's chunks. Leaving early (break, cancellation, client disconnect)
        aborts it and frees its pages."""
        req = self._make_request(prompt, params or SamplingParams(), request_id, extra_key)
        self.check_alive()
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[GenerationChunk] = asyncio.Queue()
        self.start()
        self._inbox.put(("add", (req, _loop_sink(loop, q))))
        self._wake.set()
        self._refuse_if_stopped()
        finished = False
        try:
            while True:
                chunk = await q.get()
                if chunk.error:
                    finished = True
                    raise _chunk_error(chunk)
                if chunk.finish_reason:
                    finished = True
                yield chunk
                if finished:
                    return
        finally:
            if not finished:
                self.abort(req.request_id)

    def abort(self, request_id: str) -> None:
        """Abort a request wherever it is; its pages are freed at the next step boundary (at
        once when no loop thread runs)."""
        if self._thread is None:
            with self._lock:
                self._abort_now(request_id)
        else:
            self._inbox.put(("abort", request_id))
            self._wake.set()

    def start(self) -> None:
        """Start the background loop thread (idempotent)."""
        if self._thread is None:
            self._stopping = False
            self._thread = threading.Thread(target=self._loop, name="radixray-engine", daemon=True)
            self._thread.start()

    def shutdown(self) -> None:
        if self._thread is not None:
            self._stopping = True
            self._wake.set()
            self._thread.join(timeout=30)
            self._thread = None

    def _loop(self) -> None:
        while not self._stopping:
            if not self._inbox.empty() or self.scheduler.has_work():
                try:
                    self.step()
                except Exception:  # step() already ended the affected streams with an error
                    log.exception("engine step failed")
                    if self._broken:
                        log.error("engine stopped: %s", self._broken)
                        with self._lock:
                            self._drain_inbox()  # refuse what arrived meanwhile
                        return
            else:
                self._wake.wait(0.05)
                self._wake.clear()

    @property
    def alive(self) -> bool:
        """False once a failure left the engine in an unknown state (it serves nothing more),
        or when its loop thread died."""
        return self._broken is None and (self._thread is None or self._thread.is_alive())

    def check_alive(self) -> None:
        """Raise EngineError if the engine cannot serve (see ``alive``)."""
        if self._broken:
            raise EngineError(f"engine stopped: {self._broken}")
        if self._thread is not None and not self._thread.is_alive() and not self._stopping:
            raise EngineError("engine loop thread is not running")

    def _refuse_if_stopped(self) -> None:
        """The loop may have stopped between ``check_alive`` and our ``put``: then nobody
        would ever read the inbox. Answer what is queued (an error each) ourselves."""
        if self._broken:
            with self._lock:
                self._drain_inbox()

    @staticmethod
    def _error_chunk(request_id: str, message: str) -> GenerationChunk:
        return GenerationChunk(request_id, [], "", "error", error=message, error_type="engine")

    def _fail_all(self, message: str) -> None:
        """End every request with an error and free its pages. If freeing fails too, the
        engine's state is unknown: it marks itself broken (the loop stops, health says so, new
        requests are refused) rather than keep failing every step."""
        with self._lock:
            for rid, tr in list(self._tracked.items()):
                if self._broken is None and tr.req.status is not RequestStatus.FINISHED:
                    try:
                        self.scheduler.abort(rid)
                    except Exception as e:
                        log.exception("could not free request %s after a failed step", rid)
                        self._broken = (
                            f"freeing request {rid} after a failed step raised "
                            f"{type(e).__name__}: {e}"
                        )
                del self._tracked[rid]
                if tr.sink is not None:
                    tr.sink(self._error_chunk(rid, message))

    # ------------------------------------------------------------------ introspection

    def take_events(self) -> list[KVEvent]:
        with self._lock:
            return self.cache.take_events()

    def check_integrity(self) -> None:
        with self._lock:
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
        return " | ".join((c.model, c.dtype, hw, c.attention_backend or "auto"))

    def stats(self) -> dict:
        s = self.stats_.as_dict()
        sched, alloc = self.scheduler, self.pool.allocator
        s.update(
            running=len(sched.running),
            # Requests still in the inbox are waiting too: they are accepted, not yet queued.
            waiting=len(sched.waiting) + self._inbox.qsize(),
            queued_prefill_tokens=sum(r.num_tokens - r.num_computed for r in sched.waiting)
            + sum(r.num_tokens - r.num_computed - 1 for r in sched.running if r.in_prefill),
            active_decode_tokens=sum(r.num_tokens for r in sched.running),
            free_pages=alloc.num_free,
            total_pages=alloc.num_pages,
            cached_pages=self.cache.total_tokens // self.page_size,
            evictable_pages=self.cache.evictable_tokens // self.page_size,
            page_size=self.page_size,
            preemptions=sched.num_preemptions,
            evicted_pages=sched.num_evicted_pages,
        )
        return s

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()


def _chunk_error(chunk: GenerationChunk) -> Exception:
    """The exception a caller sees for an error chunk: the client's fault or the engine's."""
    if chunk.error_type == "engine":
        return EngineError(chunk.error)
    return ValueError(chunk.error)


def _loop_sink(loop: asyncio.AbstractEventLoop, q: asyncio.Queue):
    """A sink that hands chunks from the engine thread to a consumer's event loop. A closed
    loop means the consumer is gone (its abort is on the way): drop the chunk."""

    def sink(chunk: GenerationChunk) -> None:
        try:
            loop.call_soon_threadsafe(q.put_nowait, chunk)
        except RuntimeError:
            pass

    return sink


def _replace(params: SamplingParams, **changes) -> SamplingParams:
    from dataclasses import replace

    return replace(params, **changes)


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return torch.device(device)
