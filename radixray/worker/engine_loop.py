"""The engine's only driver: one turn (commands in, one step) run by a background thread, or
run on the caller's thread while no thread runs; an inbox that other threads write to; and the
bridge from the stepping thread to asyncio consumers.

The engine core (``engine.Engine``: ``add``, ``step``, ``abort``) has no lock: it is driven by
one thread at a time. While the thread runs it is that thread; other threads only write to the
inbox (add a request, abort one, run a read of the engine's state), and their commands land at
a step boundary. While it does not (tests, benchmarks, ``generate_batch`` on a bare engine) the
caller runs the very same ``turn`` itself. A consumer's chunks come back through a sink: a
callable the stepping thread hands each chunk (or the request's error) to.

::

    other threads ── submit / abort / call ──> inbox
                                                 │
    loop thread (or the caller) ── turn(): apply inbox ─> engine.step() ─> sinks
                                                                            │
    asyncio consumer <── call_soon_threadsafe ──────────────────────────────┘
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, TypeVar

from radixray.protocol import EngineFailure, RequestError, StreamChunk

from .request import Request

if TYPE_CHECKING:
    from .engine import Engine, Sink

__all__ = ["EngineLoop"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class EngineLoop:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.thread: threading.Thread | None = None
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()  # adds and aborts, in order
        self._calls: queue.SimpleQueue = queue.SimpleQueue()  # reads: not load, kept apart
        self._wake = threading.Event()
        self._stopping = False
        self._outboxes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # by loop
        self._dirty: list[Outbox] = []  # outboxes with items this turn

    @property
    def running(self) -> bool:
        """The thread was started and not shut down (it may have died: see ``healthy``)."""
        return self.thread is not None

    @property
    def healthy(self) -> bool:
        """No thread (inline use), or a thread that is still stepping."""
        return self.thread is None or self.thread.is_alive() or self._stopping

    @property
    def pending(self) -> int:
        """Commands not yet applied (requests in the inbox are accepted, not yet queued)."""
        return self._inbox.qsize()

    def start(self) -> None:
        """Start the thread (idempotent)."""
        if self.thread is None:
            self._stopping = False
            self.thread = threading.Thread(target=self._run, name="radixray-engine", daemon=True)
            self.thread.start()

    def shutdown(self) -> None:
        if self.thread is not None:
            self._stopping = True
            self._wake.set()
            self.thread.join(timeout=30)
            self.thread = None

    # ------------------------------------------------------------------ driving

    def turn(self) -> None:
        """One turn: what other threads sent lands at this step boundary, then one step (its
        chunks go to the sinks, and the streams' chunks to their event loops, one hand-over
        each). If the step fails, its exception propagates (the engine has already ended every
        request with an error)."""
        try:
            self._apply_commands()
            if self.engine.broken is None:
                self.engine.step()
        finally:
            self.flush()

    def flush(self) -> None:
        """Hand the streams' chunks to their event loops (``Outbox``; the stepping thread)."""
        dirty = list(self._dirty)  # (the outboxes hold this list: emptied, not replaced)
        self._dirty.clear()
        for box in dirty:
            box.flush()

    def _outbox(self, loop: asyncio.AbstractEventLoop) -> Outbox:
        box = self._outboxes.get(loop)
        if box is None:  # (a consumer's thread: setdefault keeps one per loop)
            box = self._outboxes.setdefault(loop, Outbox(loop, self._dirty))
        return box

    def _run(self) -> None:
        engine = self.engine
        while not self._stopping:
            if self._inbox.empty() and self._calls.empty() and not engine.has_work():
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            try:
                self.turn()
            except Exception:  # the engine already ended the affected streams with an error
                log.exception("engine step failed")
                if engine.broken:
                    log.error("engine stopped: %s", engine.broken)
                    self._apply_commands()  # refuse what arrived meanwhile
                    self.flush()
                    return

    def _driven_elsewhere(self) -> bool:
        """A live thread other than the caller's steps the engine: wait for it, do not step."""
        t = self.thread
        return t is not None and t.is_alive() and t is not threading.current_thread()

    def run_until(self, done: threading.Event) -> None:
        """Return once ``done`` is set: the thread's turns while it runs, else the same turns
        on the caller's thread (a failed step raises here, as it would from ``step``)."""
        while not done.is_set():
            if self._driven_elsewhere():
                done.wait(0.1)
            else:
                self.turn()

    def run(self, work: Iterable[tuple[Request, Sink]]) -> None:
        """Submit requests and return once each has had its last item (final chunk or error)."""
        work = list(work)
        done = threading.Event()
        left = [len(work)]

        def finished(sink: Sink) -> Sink:
            def take(item: StreamChunk | RequestError) -> None:  # on the stepping thread
                sink(item)
                if isinstance(item, RequestError) or item.final:
                    left[0] -= 1
                    if left[0] == 0:
                        done.set()

            return take

        if not work:
            return
        for req, sink in work:
            self.submit(req, finished(sink))
        self.run_until(done)

    # ------------------------------------------------------------------ commands

    def _apply_commands(self) -> None:
        """Apply what other threads sent (by the stepping thread, at a step boundary)."""
        engine = self.engine
        while True:
            try:
                cmd, arg = self._inbox.get_nowait()
            except queue.Empty:
                break
            if cmd == "add":
                req, sink = arg
                if engine.broken:
                    sink(EngineFailure(f"engine stopped: {engine.broken}"))
                    continue
                try:
                    engine.add(req, sink)
                except RequestError as e:
                    sink(e)
            elif cmd == "abort":
                engine.abort(arg)
        self.answer_calls()

    def answer_calls(self) -> None:
        """Run the reads other threads are waiting on (by the stepping thread, between steps)."""
        while True:
            try:
                fn, fut = self._calls.get_nowait()
            except queue.Empty:
                return
            if fut.set_running_or_notify_cancel():  # not taken back by its caller
                try:
                    fut.set_result(fn())
                except Exception as e:
                    fut.set_exception(e)

    def _put(self, cmd: str, arg) -> None:
        self._inbox.put((cmd, arg))
        self._wake.set()

    def submit(self, req: Request, sink: Sink) -> None:
        """Queue a request; its chunks go to ``sink`` on the stepping thread."""
        self.engine.check_alive()
        self._put("add", (req, sink))
        # The loop may have stopped between the check and the put: then nobody would ever read
        # the inbox. Answer what is queued (an error each) here.
        if self.engine.broken:
            self._apply_commands()
            self.flush()

    def abort(self, request_id: str) -> None:
        """Abort a request wherever it is (any thread): at the next step boundary."""
        self._put("abort", request_id)

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the stepping thread at a step boundary (the engine's state is only read
        there), or here at once when no thread steps. Blocks until it has run."""
        t = self.thread
        if not self._driven_elsewhere():
            return fn()
        fut: Future = Future()
        self._calls.put((fn, fut))
        self._wake.set()
        while True:
            try:
                return fut.result(timeout=0.1)
            except FutureTimeout:
                # the thread stopped before it took the call: take it back and run it here
                if not t.is_alive() and fut.cancel():
                    return fn()

    # ------------------------------------------------------------------ consumers

    async def stream(self, req: Request) -> AsyncIterator[StreamChunk]:
        """The request's chunks as the engine produces them (starts the thread). Every chunk
        already produced when the consumer asks goes out as one (a slow reader gets fewer,
        larger chunks, never one per token when several are ready). A failure raises its
        ``RequestError``; leaving early aborts the request."""
        q: asyncio.Queue[StreamChunk | RequestError] = asyncio.Queue()
        self.engine.check_alive()  # before starting a thread for an engine that cannot serve
        self.start()
        self.submit(req, self._outbox(asyncio.get_running_loop()).sink(q))
        finished = False
        try:
            while True:
                item = await q.get()
                if isinstance(item, RequestError):
                    finished = True
                    raise item
                ready, error = [item], None
                while not item.final and not q.empty():
                    item = q.get_nowait()
                    if isinstance(item, RequestError):
                        error = item
                        break
                    ready.append(item)
                for chunk in _coalesce(ready):
                    finished = finished or chunk.final
                    yield chunk
                if error is not None:
                    finished = True
                    raise error
                if finished:
                    return
        finally:
            if not finished:
                self.abort(req.request_id)


class Outbox:
    """What the stepping thread has for one consumer event loop's queues this turn, handed over
    in one ``call_soon_threadsafe`` when the turn ends (``EngineLoop.flush``): a hand-over
    wakes the loop (a lock and a write to its self-pipe, ~7 us here), which per token of every
    stream was 0.5 ms of a 64-request decode step. Only the stepping thread touches it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, dirty: list[Outbox]):
        self._loop = weakref.ref(loop)  # (the loops' table is keyed weakly by the loop)
        self.items: list[tuple[asyncio.Queue, StreamChunk | RequestError]] = []
        self._dirty = dirty  # the engine loop's outboxes with items, flushed at the turn's end

    def sink(self, q: asyncio.Queue) -> Sink:
        def put(item: StreamChunk | RequestError) -> None:
            if not self.items:
                self._dirty.append(self)
            self.items.append((q, item))

        return put

    def flush(self) -> None:
        """Hand the items over (a closed loop means its consumers are gone, their aborts on the
        way: they are dropped)."""
        items, self.items = self.items, []
        loop = self._loop()
        try:
            if loop is not None:
                loop.call_soon_threadsafe(_deliver, items)
        except RuntimeError:
            pass


def _deliver(items: list) -> None:
    for q, item in items:
        q.put_nowait(item)


def _coalesce(chunks: list[StreamChunk]) -> list[StreamChunk]:
    """Each sample's ready chunks merged into one, in the order of their last chunks (so the
    chunk that ends the stream stays last)."""
    if len(chunks) == 1:
        return chunks
    merged: dict[int, StreamChunk] = {}
    last: dict[int, int] = {}
    for pos, c in enumerate(chunks):
        merged[c.index] = merged[c.index].merge(c) if c.index in merged else c
        last[c.index] = pos
    return [merged[i] for i in sorted(merged, key=last.__getitem__)]
