"""The worker as a Ray actor: a plain host class around the Engine, and ``ray.remote`` on top.

``WorkerHost`` is what a router talks to:

* ``generate(prompt_ids, params, request_id)``: an async generator of chunk dicts (token ids,
  text delta; the last one has ``finish_reason``, usage and the miss breakdown). Called through
  Ray with ``num_returns="streaming"``.
* ``abort(request_id)``: frees the request's pages at the next step boundary.
* ``poll(since_seq, epoch)``: load and the KV events since ``since_seq`` as one msgpack
  ``EventBatch``. When the caller missed events (a new router, a restarted worker, a log
  overrun) the batch is a snapshot: ``AllBlocksCleared`` then every cached chain.
* ``health()`` and ``info()``.

The engine loop runs on its own thread; the actor's event loop only awaits, and anything that
takes the engine's lock runs in a thread so that a step in progress never blocks it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Sequence

from radixray.cache_index.events import EventBatch, KVEvent, encode

from .config import EngineConfig
from .engine import Engine, EngineError
from .request import SamplingParams

__all__ = ["WorkerHost", "WorkerActor", "worker_actor_options", "LOAD_FIELDS"]

# Batches of events kept for routers that poll late; past this a router gets a snapshot.
EVENT_LOG_BATCHES = 4096
LOAD_FIELDS = (
    "running",
    "waiting",
    "queued_prefill_tokens",
    "active_decode_tokens",
    "free_pages",
    "total_pages",
    "cached_pages",
    "evictable_pages",
    "prefill_tokens_per_s",
    "prefill_overhead_s",
    "prefill_fit_moments",
    "decode_step_s",
    "decode_tokens_per_s",
    "hit_rate",
    "preemptions",
    "evicted_pages",
)


class WorkerHost:
    def __init__(self, config: EngineConfig | dict | None = None, worker_id: str | None = None):
        if isinstance(config, dict):
            config = EngineConfig(**config)
        config = config or EngineConfig()
        self.worker_id = worker_id or config.worker_id
        self.engine = Engine(config)
        self.engine.start()
        self.epoch = uuid.uuid4().hex  # changes when the worker restarts
        self._seq = 0
        self._log: deque[tuple[int, list[KVEvent]]] = deque(maxlen=EVENT_LOG_BATCHES)
        self._started = time.time()

    # ------------------------------------------------------------------ serving

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: dict | SamplingParams,
        request_id: str,
        extra_key: str | None = None,
    ) -> AsyncIterator[dict]:
        sp = params if isinstance(params, SamplingParams) else SamplingParams(**params)
        try:
            async for chunk in self.engine.generate(list(prompt_ids), sp, request_id, extra_key):
                yield dataclasses.asdict(chunk)
        except EngineError as e:
            # The worker failed, not the request: say so in-band, so a router retries the
            # request elsewhere (before its first token) instead of blaming the client.
            yield dataclasses.asdict(Engine._error_chunk(request_id, str(e)))

    async def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)

    # ------------------------------------------------------------------ router feed

    def _collect(self, since_seq: int, epoch: str | None) -> tuple[int, list[KVEvent], bool]:
        """Runs in a thread: takes the engine lock (a step may be in progress)."""
        with self.engine._lock:
            new = self.engine.take_events()
            if new:
                self._seq += 1
                self._log.append((self._seq, new))
            log = self._log
            if epoch == self.epoch and since_seq <= self._seq:
                if since_seq == self._seq:
                    return self._seq, [], False
                if log and log[0][0] <= since_seq + 1:
                    return self._seq, [e for s, evs in log if s > since_seq for e in evs], False
            return self._seq, self.engine.cache.snapshot_events(), True

    async def poll(self, since_seq: int = -1, epoch: str | None = None) -> dict:
        seq, events, snapshot = await asyncio.to_thread(self._collect, since_seq, epoch)
        batch = EventBatch(self.worker_id, seq, time.time(), events)
        stats = self.engine.stats()
        return {
            "worker_id": self.worker_id,
            "epoch": self.epoch,
            "seq": seq,
            "snapshot": snapshot,
            "events": encode(batch),
            "ok": self.engine.alive,
            "load": {k: stats.get(k) for k in LOAD_FIELDS},
            "stats": stats,
        }

    async def health(self) -> dict:
        thread = self.engine._thread
        ok = thread is not None and thread.is_alive() and self.engine.alive
        return {"ok": ok, "worker_id": self.worker_id, "uptime_s": time.time() - self._started}

    async def info(self) -> dict:
        e = self.engine
        return {
            "worker_id": self.worker_id,
            "epoch": self.epoch,
            "model": e.config.model,
            "page_size": e.page_size,
            "max_model_len": e.max_model_len,
            "vocab_size": e.model_config.vocab_size,
            "cache": e.config.cache,
            "num_pages": e.pool.num_pages,
            "device": str(e.device),
            "perf_class": e.perf_class,
            "pid": os.getpid(),
            "node_ip": _node_ip(),
            "node_id": _node_id(),
        }

    async def check_integrity(self) -> dict:
        """Debug: raises if any page invariant is broken; returns page counts."""
        await asyncio.to_thread(self.engine.check_integrity)
        s = self.engine.stats()
        return {
            k: s[k] for k in ("free_pages", "total_pages", "cached_pages", "running", "waiting")
        }

    def shutdown(self) -> None:
        self.engine.shutdown()


def _node_ip() -> str | None:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:
        return None


def _node_id() -> str | None:
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    except Exception:
        return None


def worker_actor_options(
    use_gpu: bool,
    num_cpus: float = 0.5,
    resources: dict | None = None,
    max_concurrency: int = 1000,
) -> dict:
    """Ray options for one worker: a whole GPU, or a fraction of a CPU; optional custom resources
    pin it to a node (``{"node:1.2.3.4": 0.01}`` or a label of the cluster's own)."""
    opts: dict = {"max_concurrency": max_concurrency, "resources": dict(resources or {})}
    if use_gpu:
        opts.update(num_gpus=1, num_cpus=1)
    else:
        opts.update(num_gpus=0, num_cpus=num_cpus)
    return opts


def _make_actor_class():
    import ray

    return ray.remote(WorkerHost)


class _LazyActor:
    """``WorkerActor`` is ``ray.remote(WorkerHost)``, built on first use so that importing this
    module does not import Ray."""

    _cls = None

    def __getattr__(self, name):
        if _LazyActor._cls is None:
            _LazyActor._cls = _make_actor_class()
        return getattr(_LazyActor._cls, name)


WorkerActor = _LazyActor()
