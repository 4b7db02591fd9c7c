"""``WorkerHost``: one engine behind the worker protocol (``radixray.protocol.rpc``).

It answers the protocol's methods with typed messages (``generate``, ``abort``, ``poll``,
``info``, ``health``) and exposes the two byte-level entry points every transport uses:
``call(method, payload)`` and ``stream(method, payload)``. The Ray actor, the Serve replica
and the HTTP server (``http_server.py``) are thin shells around those two; the host builds no
server itself (the CLI and the Ray actor, ``actor.py``, do).

``poll`` carries the KV events since the caller's ``since_seq`` as one msgpack ``EventBatch``.
When the caller missed events (a new router, a restarted worker, a log overrun) the batch is a
snapshot: ``AllBlocksCleared`` then every cached chain.

It uses the engine's public API only. Anything that reads the engine's state (which waits for
the step in progress to end) runs in a thread, so the event loop never waits for a step.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator

import msgspec

from radixray.cache_index.events import EventBatch, KVEvent, encode_events
from radixray.protocol import (
    AbortRequest,
    Ack,
    Empty,
    GenerateRequest,
    Health,
    PollRequest,
    PollResult,
    StreamChunk,
    WorkerInfo,
    serve_call,
    serve_stream,
)

from .engine import Engine
from .engine_config import EngineConfig

__all__ = ["WorkerHost", "EVENT_LOG_BATCHES"]

# Batches of events kept for routers that poll late; past this a router gets a snapshot.
EVENT_LOG_BATCHES = 4096
# A router that has not polled for this long is no longer listed in the load report.
ROUTER_SEEN_S = 10.0


class WorkerHost:
    def __init__(
        self,
        config: EngineConfig | dict | None = None,
        worker_id: str | None = None,
        address: str | None = None,
    ):
        """``worker_id``: the id routers know this worker by (default: the config's, else
        derived from ``address``, which is unique per process); ``address``: where it can be
        reached (``host:port`` of an HTTP worker, a Ray actor id), reported in ``info``."""
        if isinstance(config, dict):
            config = EngineConfig(**config)
        config = config or EngineConfig()
        self.address = address or _default_address()
        self.worker_id = worker_id or config.worker_id or self.address
        self.engine = Engine(config)
        self.engine.start()
        self.epoch = uuid.uuid4().hex  # changes when the worker restarts
        self._seq = 0
        self._log: deque[tuple[int, list[KVEvent]]] = deque(maxlen=EVENT_LOG_BATCHES)
        self._log_lock = threading.Lock()  # polls may overlap (one asked for during a round)
        self._started = time.time()
        self.http_url: str | None = None  # set by whoever serves it over HTTP (actor.py)
        self._routers: dict[str, float] = {}  # router id -> when it last polled (monotonic)

    # ------------------------------------------------------------------ transports

    async def call(self, method: str, payload: bytes) -> bytes:
        """One encoded unary call (the Ray actor's and the Serve replica's entry point)."""
        return await serve_call(self, method, payload)

    # One encoded streaming call, ``stream(method, payload)``: encoded chunks, then the final
    # one or an error. The protocol's own async generator function, bound as this method (Ray
    # sees a generator method and streams its items).
    stream = serve_stream

    # ------------------------------------------------------------------ the protocol

    def generate(self, req: GenerateRequest) -> AsyncIterator[StreamChunk]:
        """The engine loop's stream of the request (a bad request raises here)."""
        return self.engine.generate(req.prompt_ids, req.params, req.request_id, req.extra_key)

    async def abort(self, req: AbortRequest) -> Ack:
        self.engine.loop.abort(req.request_id)  # from this thread: at the next step boundary
        return Ack()

    async def poll(self, req: PollRequest) -> PollResult:
        seq, events, snapshot = await asyncio.to_thread(self._collect, req.since_seq, req.epoch)
        load, counters = self.engine.report()
        load = msgspec.structs.replace(load, routers=self._seen_routers(req.router_id))
        return PollResult(
            self.worker_id,
            self.epoch,
            seq,
            snapshot,
            encode_events(EventBatch(self.worker_id, seq, time.time(), events)),
            self.engine.alive,
            load,
            counters,
        )

    async def info(self, req: Empty | None = None) -> WorkerInfo:
        e = self.engine
        return WorkerInfo(
            worker_id=self.worker_id,
            epoch=self.epoch,
            model=e.config.model,
            page_size=e.page_size,
            max_model_len=e.max_model_len,
            vocab_size=e.model_config.vocab_size,
            cache=getattr(e, "cache_kind", e.config.cache),
            num_pages=e.pool.num_pages,
            device=str(e.device),
            perf_class=e.perf_class,
            address=self.address,
            pid=os.getpid(),
            node_ip=_node_ip(),
            node_id=_node_id(),
            http_url=self.http_url,
        )

    async def health(self, req: Empty | None = None) -> Health:
        alive = self.engine.alive
        detail = None if alive else f"engine stopped: {self.engine.broken or 'loop not running'}"
        return Health(alive, self.worker_id, time.time() - self._started, detail)

    def _seen_routers(self, router_id: str | None) -> tuple[str, ...]:
        now = time.monotonic()
        if router_id is not None:
            self._routers[router_id] = now
        for rid, at in list(self._routers.items()):
            if now - at > ROUTER_SEEN_S:
                del self._routers[rid]
        return tuple(sorted(self._routers))

    # ------------------------------------------------------------------ events

    def _collect(self, since_seq: int, epoch: str | None) -> tuple[int, list[KVEvent], bool]:
        """Runs in a thread (the engine's state is read at a step boundary). A snapshot is
        taken after the events: an event that lands in between is in the snapshot and again in
        the next poll, and applying a stored or removed block twice changes nothing."""
        with self._log_lock:
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
            return self._seq, self.engine.snapshot_events(), True

    # ------------------------------------------------------------------ debug, lifecycle

    async def check_integrity(self) -> dict:
        """Debug: raises if any page invariant is broken; returns page counts."""
        await asyncio.to_thread(self.engine.check_integrity)
        s = self.engine.stats()
        return {
            k: s[k] for k in ("free_pages", "total_pages", "cached_pages", "running", "waiting")
        }

    def shutdown(self) -> None:
        self.engine.shutdown()


def _ray():
    """Ray, if this process already uses it (an actor, a Serve replica); never imported here."""
    ray = sys.modules.get("ray")
    return ray if ray is not None and ray.is_initialized() else None


_hosts_in_process = itertools.count()


def _default_address() -> str:
    """Unique: the Ray actor id inside an actor, else host, pid and which host of the process."""
    ray = _ray()
    actor = ray.get_runtime_context().get_actor_id() if ray else None
    if actor:
        return f"ray-actor:{actor}"
    return f"{socket.gethostname()}:pid{os.getpid()}:{next(_hosts_in_process)}"


def _node_ip() -> str | None:
    ray = _ray()
    return ray.util.get_node_ip_address() if ray else None


def _node_id() -> str | None:
    ray = _ray()
    return ray.get_runtime_context().get_node_id() if ray else None
