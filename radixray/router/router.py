"""choose -> dispatch -> stream -> feed back actual reuse.

``Router.open(request)`` (a ``GenerateRequest``) hashes the prompt's pages, asks the policy,
records the optimistic index entry, dispatches to the chosen worker and waits for the first
chunk. A worker that fails before its first chunk is marked down and the request is retried on
another worker (bounded, with backoff). The returned ``RoutedStream`` yields the chunks; closing
it early aborts the request on the worker, so its pages are freed.

Closed loop: every final chunk carries the worker's actual cached tokens. When it is below the
prediction, the router's view of that worker was stale, so that worker is polled at once (its
KV events are the truth); predicted and actual are recorded with the decision.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable

from radixray.cache_index import ApproxIndex, hash_blocks
from radixray.protocol import (
    EngineFailure,
    GenerateRequest,
    Overloaded,
    RequestError,
    StreamChunk,
    WorkerUnavailable,
)

from .dispatch import DecisionRecord, Dispatcher
from .policies import NoHealthyWorker, Policy, RoutingRequest
from .worker_pool import WorkerPool

__all__ = ["Router", "RoutedStream", "DecisionRecord", "NoWorkerAvailable", "RequestFailed"]

log = logging.getLogger(__name__)


class NoWorkerAvailable(WorkerUnavailable):
    """No healthy worker could take the request (after retries): a 503."""


class RequestFailed(EngineFailure):
    """Workers' engines failed while running this request, on more than one worker: likely the
    request itself trips them, so it is not retried further (a server error, not the client's)."""


class RoutedStream:
    """One routed request: ``decision``, ``record``, ``first`` chunk, then ``async for``.

    Iterating yields the first chunk, then the rest, up to the final one. A worker that fails
    mid-stream raises its ``RequestError`` (the edge ends the answer with an error event);
    ``aclose()`` before the end aborts the request on the worker. ``on_close`` runs exactly
    once, however the stream ends (the service releases the request's admission slot).
    """

    def __init__(
        self,
        router: Router,
        worker_id: str,
        request_id: str,
        agen,
        first: StreamChunk,
        record: DecisionRecord,
        started: float,
        on_close: Callable[[], None] | None = None,
    ):
        self.router = router
        self.worker_id = worker_id
        self.request_id = request_id
        self.record = record
        self.first = first
        self.on_close = on_close
        self._agen = agen
        self._started = started
        self._done = False
        self._first_pending = True

    @property
    def cached_tokens(self) -> int:
        return self.first.cached_tokens

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
        if chunk.token_ids:
            self.router.pool.track_tokens(self.worker_id, self.request_id, len(chunk.token_ids))
        if chunk.finish_reason is not None:
            self._end(chunk, None)
        return chunk

    def _end(self, final: StreamChunk | None, error: str | None) -> None:
        if self._done:
            return
        self._done = True
        self.router._complete(self, final, error)
        if self.on_close is not None:
            self.on_close()

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
    ):
        """``max_inflight_per_worker``: when every routable worker has this many requests
        (running + waiting), a new one is refused as ``Overloaded`` (a 429) instead of queued."""
        self.pool = pool
        self.index = index or pool.index
        self.page_size = self.index.page_size
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self._ids = itertools.count()
        self.max_inflight_per_worker = max_inflight_per_worker
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
        self,
        req: GenerateRequest,
        session_key: str | None = None,
        on_close: Callable[[], None] | None = None,
    ) -> RoutedStream:
        """Route ``req`` and return its stream once the first chunk is in. Raises the
        ``RequestError`` that ended it: ``InvalidRequest`` (the client's), ``NoWorkerAvailable``
        (no worker left to try), ``RequestFailed`` (engines failed on two workers)."""
        prompt_ids = req.prompt_ids
        request_id = req.request_id
        hashes = hash_blocks(prompt_ids, self.page_size, extra_key=req.extra_key)
        rr = RoutingRequest(request_id, len(prompt_ids), hashes, session_key, time.monotonic())
        started = time.monotonic()
        excluded: set[str] = set()
        last_error = "no healthy worker"
        engine_failures = 0
        for attempt in range(1, self.max_retries + 2):
            states = [s for s in self.pool.states() if s.worker_id not in excluded]
            limit = self.max_inflight_per_worker
            if attempt == 1 and limit and states and all(s.load >= limit for s in states):
                raise Overloaded(
                    f"The server is overloaded: every worker has {limit} requests in flight; "
                    "retry later"
                )
            self.policy.fleet = self.pool.fleet_position()
            try:
                decision, record = self.dispatch.decide(rr, states, attempt)
            except NoHealthyWorker:
                if engine_failures:  # nowhere left to retry: the failure was an engine's
                    raise RequestFailed(
                        f"the engine failed and no other worker is left: {last_error}"
                    ) from None
                raise NoWorkerAvailable(f"No worker is available: {last_error}") from None
            wid = decision.worker_id
            entry = self.pool.workers[wid]
            # what the worker can reuse: page-aligned, at most n - 1 tokens (the record's cap)
            predicted = record.predicted_cached_tokens
            self.pool.track_dispatch(wid, request_id, len(prompt_ids) - predicted, len(prompt_ids))
            agen = entry.client.generate(req)
            try:
                first = await agen.__anext__()
            except (WorkerUnavailable, Overloaded, EngineFailure) as e:
                self.pool.track_finish(wid, request_id)
                excluded.add(wid)
                last_error = f"worker {wid}: {e.message}"
                record.error = last_error
                self.dispatch.log(record)
                if isinstance(e, WorkerUnavailable):
                    self.pool.mark_down(wid, e.message)
                elif isinstance(e, EngineFailure):
                    # The worker's engine failed before this request produced anything: another
                    # worker can serve it, once (a request that fails two engines is likely
                    # what trips them, and every retry takes a whole batch down with it). Poll
                    # the failed worker now; if it reports its engine stopped, it leaves.
                    self.pool.poll_now(wid)
                    engine_failures += 1
                    if engine_failures > 1:
                        raise RequestFailed(
                            f"the engine failed on {engine_failures} workers: {last_error}"
                        ) from None
                await asyncio.sleep(self.retry_backoff_s * attempt)
                continue
            except BaseException:  # the client's own error, or cancellation
                self.pool.track_finish(wid, request_id)
                raise
            self.pool.track_first_token(wid, request_id)
            record.ttft_s = time.monotonic() - started
            return RoutedStream(self, wid, request_id, agen, first, record, started, on_close)
        raise NoWorkerAvailable(f"gave up after {self.max_retries + 1} attempts: {last_error}")

    def _complete(self, stream: RoutedStream, final: StreamChunk | None, error: str | None):
        rec = stream.record
        wid = stream.worker_id
        self.pool.track_finish(wid, stream.request_id)
        rec.latency_s = time.monotonic() - stream._started
        if final is None:
            rec.finish_reason = "abort" if error and error.startswith("aborted") else "error"
            rec.error = error
        else:
            rec.finish_reason = final.finish_reason
            rec.completion_tokens = final.completion_tokens
            rec.miss = dict(final.miss) if final.miss else None
            if self.dispatch.complete(rec, stream.request_id, final.cached_tokens):
                # The index promised blocks the worker did not have: its view of this worker is
                # stale (an eviction not yet reported). The blocks themselves are right again
                # now (the worker just computed them), so resync from the worker's own events
                # at once instead of waiting for the next poll.
                self.pool.poll_now(wid)
        self.dispatch.log(rec)
