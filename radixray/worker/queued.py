"""``QueuedPrefill``: the prefill work a worker's queue holds, as routers are told it.

A worker reports ``queued_prefill_tokens``, the prompt tokens its accepted requests have still
to compute (``LoadReport``). A waiting request has computed nothing yet, but it will not compute
all of its prompt: admission reuses what the cache holds, and requests queued ahead of it on
this worker (waiting, or part-way through their prefill) compute and cache the prefix they share
with it first. Counting whole prompts made a worker holding a conversation look as busy as if
every queued turn recomputed its history, and every reader took that at face value: the
policies' queue terms, and admission's wait (one live run refused at an estimated 30 s while
its served p99 was 12 s); benchmarks/HISTORY.md, "Queued work net of the cache".

So each request is counted, when it joins the queue (``enqueue``: arrival, preemption, a sample
waiting for room), as its tokens beyond the longer of two prefixes: the one the cache holds (a
read-only ``peek``, either tier: a host-tier prefix is loaded back, not recomputed) and the one
that requests queued ahead of it will compute (by the chained page hashes of their prompts: equal
hashes mean equal prefixes). The count is an estimate fixed at that moment, as the router's own
per-request prediction is: an eviction while it waits, or the request ahead being aborted, is not
seen. Running prefills are counted exactly (what they have left).

Cost: O(edges + pages of the prompt) per enqueue; ``tokens`` is O(requests queued).
"""

from __future__ import annotations

from .page_manager import PageManager
from .request import Request, RequestStatus

__all__ = ["QueuedPrefill"]


def _pending(req: Request) -> bool:
    """It will still compute prompt pages: waiting, or running in its prefill."""
    return req.status is RequestStatus.WAITING or (
        req.status is RequestStatus.RUNNING and req.in_prefill
    )


class QueuedPrefill:
    """Per request, the prefill tokens it adds to the queue (``Request.queued_tokens``), and the
    queue's total. ``pages`` answers the cache's read-only prefix peek; ``waiting`` and
    ``running`` are the scheduler's lists (read, never changed here)."""

    def __init__(self, pages: PageManager, waiting: list[Request], running: list[Request]):
        self.pages = pages
        self.waiting = waiting
        self.running = running
        self.P = pages.P
        # page hash -> a queued request whose prompt holds that page (stale entries, of requests
        # no longer pending, are skipped when read and dropped by ``_prune``)
        self._by_hash: dict[int, Request] = {}
        self._kept = 0  # entries the last prune kept

    def enqueue(self, req: Request) -> None:
        """``req`` joins the queue now (before it is put in ``waiting``): sets
        ``req.queued_tokens``."""
        n = req.num_tokens
        if not self.pages.reuse or req.needs_prompt_logits:
            req.queued_tokens = n - req.num_computed
            return
        hashes = self.pages.matchable(req)
        cached = self.pages.peek(req) // self.P
        by_hash, k = self._by_hash, cached
        while k < len(hashes):
            ahead = by_hash.get(hashes[k])
            if ahead is None or ahead is req or not _pending(ahead):
                break
            k += 1
        req.queued_tokens = n - k * self.P
        for h in hashes[k:]:  # pages it computes itself: later arrivals share them
            by_hash[h] = req
        if len(by_hash) > max(4096, 2 * self._kept):
            self._prune(req)

    def _prune(self, req: Request) -> None:
        """Rebuild the page map from the requests still pending: when it has doubled since the
        last rebuild, so amortised O(1) a registered page."""
        by_hash: dict[int, Request] = {}
        for r in (*self.waiting, *self.running, req):
            if _pending(r) and not r.needs_prompt_logits:
                for h in self.pages.matchable(r):
                    by_hash.setdefault(h, r)
        self._by_hash = by_hash
        self._kept = len(by_hash)

    def in_flight_hashes(self) -> set[int]:
        """Block hashes of prompt pages that running requests are computing right now."""
        out: set[int] = set()
        for r in self.running:
            if r.in_prefill:
                out.update(r.block_hashes[r.num_tree_pages : r.num_prompt // self.P])
        return out

    def tokens(self) -> int:
        """Prefill tokens still to compute: each waiting request's estimate, and what the running
        prefills have left (the last token of a prompt is the first decode step's)."""
        return sum(r.queued_tokens for r in self.waiting) + sum(
            r.num_tokens - r.num_computed - 1 for r in self.running if r.in_prefill
        )

    def load(self) -> tuple[int, int, int, int]:
        """``(running, waiting, queued_prefill_tokens, active_decode_tokens)`` for routers (engine
        and simulator alike): running decode, a token of every step each; waiting are the rest,
        mid-prefill too, as routers count (``router/traffic.py``); queued: ``tokens``; active
        decode tokens: the context of the decoding requests (a router adds a request's context
        at its first token)."""
        decoding = [r for r in self.running if not r.in_prefill]
        waiting = len(self.waiting) + len(self.running) - len(decoding)
        context = sum(r.num_tokens for r in decoding)
        return len(decoding), waiting, self.tokens(), context
