"""A request's path through the router, one story in one object, ``RoutedRequest``::

    admit    take a slot among the requests in flight, or refuse (``Overloaded``: a 429)
    route    hash the prompt's pages; each attempt: the policy chooses (``Dispatcher.decide``:
             the decision, its record, the optimistic index entry), the request joins its
             worker's tally (``Traffic``), is sent, and its first chunk is awaited. A worker
             that fails before its first chunk leaves the tally, is marked down (or, for an
             engine failure, polled at once) and the next attempt excludes it (bounded, with
             backoff); the first chunk moves the request from waiting to running in the tally
    stream   ``async for`` yields the first chunk, then the rest; each chunk's tokens grow the
             request's context in the tally; ``aclose()`` before the end aborts it on the
             worker, so its pages are freed
    end      exactly once, however the request ends: it leaves the tally, its record gets the
             outcome (the worker's actual reuse goes back to the dispatcher and policy) and is
             logged, and its admission slot is released

Closed loop: every final chunk carries the worker's actual cached tokens. When it is below the
prediction, the router's view of that worker was stale, so that worker is polled at once (its
KV events are the truth); predicted and actual are recorded with the decision.

``Router`` holds only what requests share: the pool, the dispatcher, the admission count and
the retry settings.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time

from radixray.cache_index import ApproxIndex, hash_blocks
from radixray.protocol import (
    EngineFailure,
    GenerateRequest,
    Overloaded,
    RequestError,
    StreamChunk,
    WorkerUnavailable,
)

from .admission import Admission
from .dispatch import DecisionRecord, Dispatcher
from .policies import NoHealthyWorker, Policy, RoutingRequest
from .traffic import Traffic
from .worker_pool import WorkerPool

__all__ = [
    "Router",
    "RoutedRequest",
    "Admission",  # re-exported: it lives in admission.py
    "DecisionRecord",
    "NoWorkerAvailable",
    "RequestFailed",
]

log = logging.getLogger(__name__)


class NoWorkerAvailable(WorkerUnavailable):
    """No healthy worker could take the request (after retries): a 503."""


class RequestFailed(EngineFailure):
    """Workers' engines failed while running this request, on more than one worker: likely the
    request itself trips them, so it is not retried further (a server error, not the client's)."""


class Router:
    def __init__(
        self,
        pool: WorkerPool,
        policy: Policy,
        index: ApproxIndex | None = None,
        max_retries: int = 2,
        retry_backoff_s: float = 0.05,
        decision_log_size: int = 1024,
        max_inflight_per_worker: int | None = None,
        router_id: str | None = None,
        herd_window: int = 64,
        max_inflight: int | None = None,
        max_queue_s: float | None = None,
        retry_after_s: int = 1,
    ):
        """``max_inflight``: requests in flight across all workers before a new one is refused
        as ``Overloaded`` (a 429); ``max_inflight_per_worker``: likewise, when every routable
        worker has this many requests (running + waiting); ``max_queue_s``: likewise, when the
        least-queued worker would make a new request wait longer than this before its prefill
        (``admission.py``; its Retry-After is the time that backlog takes to drain, at least
        ``retry_after_s``)."""
        self.pool = pool
        self.index = index or pool.index
        self.page_size = self.index.page_size
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self._ids = itertools.count()
        self.admission = Admission(max_inflight, max_queue_s, max_inflight_per_worker)
        self.retry_after_s = retry_after_s
        self.router_id = router_id
        self.dispatch = Dispatcher(
            policy,
            self.index,
            router_id=router_id,
            herd_window=herd_window,
            decision_log_size=decision_log_size,
        )

    @property
    def policy(self) -> Policy:
        """The policy routing this router's requests (its dispatcher's)."""
        return self.dispatch.policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        self.dispatch.policy = policy

    def new_request_id(self) -> str:
        return f"rr-{int(time.time() * 1000):x}-{next(self._ids)}"

    async def open(
        self, req: GenerateRequest, session_key: str | None = None, cache_key: str | None = None
    ) -> RoutedRequest:
        """Admit and route ``req``; return it once its first chunk is in (then iterate it).
        Raises the ``RequestError`` that ended it: ``Overloaded``, ``InvalidRequest`` (the
        client's), ``NoWorkerAvailable`` (no worker left to try), ``RequestFailed`` (engines
        failed on two workers)."""
        request = RoutedRequest(self, req, session_key, cache_key)
        await request.route()
        return request


class RoutedRequest:
    """One request's life in the router: its attempts, its place in its worker's tally, its
    decision record and its admission slot, released exactly once (``_end``).

    Read ``worker_id``, ``record``, ``first`` (chunk) and ``cached_tokens`` once routed;
    iterating yields the first chunk, then the rest, up to the final one (a request with ``n``
    samples streams them all, each sample's end marked, the last one final). A worker that fails
    mid-stream raises its ``RequestError`` (the edge ends the answer with an error event).
    """

    def __init__(
        self,
        router: Router,
        req: GenerateRequest,
        session_key: str | None = None,
        cache_key: str | None = None,
    ):
        self.router = router
        self.req = req
        self.request_id = req.request_id
        self.session_key = session_key
        self.cache_key = cache_key
        self.started = time.monotonic()
        self.worker_id: str | None = None
        self.record: DecisionRecord | None = None
        self.first: StreamChunk | None = None
        self._tally: Traffic | None = None  # the worker's tally while the request is on it
        self._agen = None
        self._first_pending = True
        self._done = False
        self._completion_tokens = 0  # of the samples ended so far

    @property
    def cached_tokens(self) -> int:
        return self.first.cached_tokens

    # ------------------------------------------------------------------ admit and route

    async def route(self) -> None:
        """Admit, then try workers until one sends the first chunk; or raise, holding nothing.
        Called once, by ``Router.open``."""
        admission = self.router.admission
        admission.admit()
        try:
            await self._attempts()
        except BaseException:
            admission.release()
            raise

    async def _attempts(self) -> None:
        router, pool, req = self.router, self.router.pool, self.req
        n = len(req.prompt_ids)
        hashes = hash_blocks(req.prompt_ids, router.page_size, extra_key=req.extra_key)
        self.started = time.monotonic()  # ttft and latency count from here
        rr = RoutingRequest(
            self.request_id,
            n,
            hashes,
            self.session_key,
            self.started,
            pool.fleet_position(),
            self.cache_key,
        )
        excluded: set[str] = set()
        last_error = "no healthy worker"
        engine_failures = 0
        for attempt in range(1, router.max_retries + 2):
            states = [s for s in pool.states() if s.worker_id not in excluded]
            if attempt == 1:  # room on some worker (admission.py), else Overloaded
                router.admission.check_room(states, pool.queue_wait_s(states), router.retry_after_s)
            if attempt > 1:  # a poll may have changed the fleet during the backoff
                rr = dataclasses.replace(rr, fleet=pool.fleet_position())
            try:
                decision, record = router.dispatch.decide(rr, states, attempt)
            except NoHealthyWorker:
                if engine_failures:  # nowhere left to retry: the failure was an engine's
                    raise RequestFailed(
                        f"the engine failed and no other worker is left: {last_error}"
                    ) from None
                raise NoWorkerAvailable(f"No worker is available: {last_error}") from None
            wid = self.worker_id = decision.worker_id
            entry = pool.workers[wid]
            self.record = record
            # the tally counts what the worker must prefill: the prompt less the record's
            # predicted reuse (page-aligned, at most n - 1 tokens)
            self._tally = entry.traffic
            self._tally.dispatch(self.request_id, n - record.predicted_cached_tokens, n)
            agen = entry.client.generate(req)
            try:
                first = await agen.__anext__()
            except (WorkerUnavailable, Overloaded, EngineFailure) as e:
                self._leave_tally()
                excluded.add(wid)
                last_error = record.error = f"worker {wid}: {e.message}"
                router.dispatch.log(record)
                if isinstance(e, WorkerUnavailable):
                    pool.mark_down(wid, e.message)
                elif isinstance(e, EngineFailure):
                    # The worker's engine failed before this request produced anything: another
                    # worker can serve it, once (a request that fails two engines is likely
                    # what trips them, and every retry takes a whole batch down with it). Poll
                    # the failed worker now; if it reports its engine stopped, it leaves.
                    pool.poll_now(wid)
                    engine_failures += 1
                    if engine_failures > 1:
                        raise RequestFailed(
                            f"the engine failed on {engine_failures} workers: {last_error}"
                        ) from None
                await asyncio.sleep(router.retry_backoff_s * attempt)
                continue
            except BaseException:  # the client's own error, or cancellation
                self._leave_tally()
                raise
            self._tally.first_token(self.request_id)
            router.dispatch.first_token(record, self.request_id)
            record.ttft_s = time.monotonic() - self.started
            self.first, self._agen = first, agen
            return
        raise NoWorkerAvailable(f"gave up after {router.max_retries + 1} attempts: {last_error}")

    def _leave_tally(self) -> None:
        if self._tally is not None:
            self._tally.finish(self.request_id)
            self._tally = None

    # ------------------------------------------------------------------ stream

    def __aiter__(self):
        return self

    async def __anext__(self) -> StreamChunk:
        if self._done:
            raise StopAsyncIteration
        if self._first_pending:
            self._first_pending = False
            chunk = self.first
        else:
            try:
                chunk = await self._agen.__anext__()
            except StopAsyncIteration:  # the client ends a stream after its final chunk only
                self._end(None, f"worker {self.worker_id} ended the stream early")
                raise WorkerUnavailable(f"worker {self.worker_id} ended the stream early") from None
            except RequestError as e:
                if isinstance(e, WorkerUnavailable):
                    self.router.pool.mark_down(self.worker_id, str(e))
                self._end(None, f"worker {self.worker_id} failed mid-stream: {e.message}")
                raise
        if chunk.token_ids and self._tally is not None:
            self._tally.tokens(self.request_id, len(chunk.token_ids))
        if chunk.ended:  # one sample's end (a request with n samples has n)
            self._completion_tokens += chunk.completion_tokens
            if chunk.final:
                self._end(chunk, None)
        return chunk

    async def aclose(self) -> None:
        """Stop (at the end, or early when the client is gone: then abort on the worker)."""
        if self._done:
            return
        self._end(None, "aborted: the client went away")
        entry = self.router.pool.workers.get(self.worker_id)
        if entry is not None:
            try:
                await entry.client.abort(self.request_id)
            except RequestError:  # the worker is gone: nothing to free there
                pass
        try:
            await self._agen.aclose()
        except Exception:  # the generator may already be broken; nothing else to free here
            pass

    # ------------------------------------------------------------------ end

    def _end(self, final: StreamChunk | None, error: str | None) -> None:
        """Release everything the request holds, once."""
        if self._done:
            return
        self._done = True
        router, rec = self.router, self.record
        self._leave_tally()
        rec.latency_s = time.monotonic() - self.started
        if final is None:
            rec.finish_reason = "abort" if error and error.startswith("aborted") else "error"
            rec.error = error
            router.dispatch.abandon(rec, self.request_id)
        else:
            rec.finish_reason = final.finish_reason
            rec.completion_tokens = self._completion_tokens
            rec.miss = dict(final.miss) if final.miss else None
            if router.dispatch.complete(rec, self.request_id, final.cached_tokens):
                # The index promised blocks the worker did not have: its view of this worker is
                # stale (an eviction not yet reported). The blocks themselves are right again
                # now (the worker just computed them), so resync from the worker's own events
                # at once instead of waiting for the next poll.
                router.pool.poll_now(self.worker_id)
        router.dispatch.log(rec)
        router.admission.release()
