"""The engine's background loop: a thread that steps the engine, an inbox that other threads
write to, and the bridge from the engine's thread to asyncio consumers.

Commands (add a request, abort one) from other threads go through the inbox; only a stepping
thread drains it (at a step boundary, under the engine's lock), so the scheduler's state is
only ever touched by one thread at a time. A consumer's chunks come back through a sink that
hands them to the consumer's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from radixray.protocol import EngineFailure, RequestError, StreamChunk

from .request import Completion, Request

if TYPE_CHECKING:
    from .engine import Engine, Sink

__all__ = ["EngineLoop"]

log = logging.getLogger(__name__)


class EngineLoop:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.thread: threading.Thread | None = None
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stopping = False

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

    def _run(self) -> None:
        engine = self.engine
        while not self._stopping:
            if not self._inbox.empty() or engine.has_work():
                try:
                    engine.step()
                except Exception:  # step() already ended the affected streams with an error
                    log.exception("engine step failed")
                    if engine.broken:
                        log.error("engine stopped: %s", engine.broken)
                        self.apply_commands()  # refuse what arrived meanwhile
                        return
            else:
                self._wake.wait(0.05)
                self._wake.clear()

    # ------------------------------------------------------------------ commands

    def apply_commands(self) -> None:
        """Apply what other threads sent (called by a stepping thread, at a step boundary)."""
        engine = self.engine
        with engine.lock:
            while True:
                try:
                    cmd, arg = self._inbox.get_nowait()
                except queue.Empty:
                    return
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
                    engine.abort_now(arg)

    def submit(self, req: Request, sink: Sink) -> None:
        self.engine.check_alive()
        self.start()
        self._inbox.put(("add", (req, sink)))
        self._wake.set()
        # The loop may have stopped between the check and the put: then nobody would ever read
        # the inbox. Answer what is queued (an error each) here.
        if self.engine.broken:
            self.apply_commands()

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))
        self._wake.set()

    # ------------------------------------------------------------------ consumers

    async def stream(self, req: Request) -> AsyncIterator[StreamChunk]:
        """The request's chunks as the engine produces them. Every chunk already produced when
        the consumer asks goes out as one (a slow reader gets fewer, larger chunks, never one
        per token when several are ready). A failure raises its ``RequestError``; leaving early
        aborts the request."""
        q: asyncio.Queue[StreamChunk | RequestError] = asyncio.Queue()
        self.submit(req, _loop_sink(asyncio.get_running_loop(), q))
        finished = False
        try:
            while True:
                item = await q.get()
                if isinstance(item, RequestError):
                    finished = True
                    raise item
                error = None
                while not item.final and not q.empty():
                    nxt = q.get_nowait()
                    if isinstance(nxt, RequestError):
                        error = nxt
                        break
                    item = item.merge(nxt)
                finished = item.final or error is not None
                yield item
                if error is not None:
                    raise error
                if finished:
                    return
        finally:
            if not finished:
                self.abort(req.request_id)

    def run_batch(self, reqs: list[Request]) -> list[Completion]:
        """Run ``reqs`` on the loop thread and block until all finish (``generate_batch`` while
        the loop runs)."""
        done = threading.Semaphore(0)
        texts: dict[str, list[str]] = {r.request_id: [] for r in reqs}
        tokens: dict[str, list[int]] = {r.request_id: [] for r in reqs}
        final: dict[str, StreamChunk | RequestError] = {}

        def sink_for(rid: str) -> Sink:
            def sink(item: StreamChunk | RequestError) -> None:  # on the loop thread
                if isinstance(item, RequestError):
                    final[rid] = item
                    done.release()
                    return
                texts[rid].append(item.text)
                tokens[rid] += item.token_ids
                if item.final:
                    final[rid] = item
                    done.release()

            return sink

        for r in reqs:
            self.submit(r, sink_for(r.request_id))
        for _ in reqs:
            done.acquire()
        out = []
        for r in reqs:
            c = final[r.request_id]
            if isinstance(c, RequestError):
                raise c
            out.append(
                Completion(
                    r.request_id,
                    "".join(texts[r.request_id]),
                    tokens[r.request_id],
                    c.prompt_tokens,
                    c.cached_tokens,
                    c.completion_tokens,
                    c.finish_reason,
                    dict(c.miss or {}),
                )
            )
        return out


def _loop_sink(loop: asyncio.AbstractEventLoop, q: asyncio.Queue) -> Sink:
    """A sink that hands items from the engine thread to a consumer's event loop. A closed loop
    means the consumer is gone (its abort is on the way): drop the item."""

    def sink(item: StreamChunk | RequestError) -> None:
        try:
            loop.call_soon_threadsafe(q.put_nowait, item)
        except RuntimeError:
            pass

    return sink
