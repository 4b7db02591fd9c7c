"""Admission, chunked prefill, continuous batching and preemption. Ints and lists only.

One ``schedule()`` call plans one model step under a token budget. Running decodes go first (one
token each); the rest of the budget goes to prefill work in ``prefill_order``:

- ``"ratio"`` (the default): running prefills and waiting requests in one order, highest response
  ratio first, (waited + left) / left, with ``left`` a request's uncomputed tokens (net of its
  cached prefix) and ``waited`` the tokens the worker computed since it arrived (``work``): a
  short prompt passes a long prefill within a step, and a long one's wait counts for it, so it is
  not held behind a stream of short ones.
- ``"shortest"``: the same requests, fewest uncomputed tokens first.
- ``"fcfs"``: unfinished prefills continue first (a chunk each, by arrival), then waiting requests
  are admitted by longest cached prefix; a long prompt's chunks hold the budget until it is done.

In every order, requests that waited ``max_wait_steps`` steps go first, by arrival (in fcfs,
first among the admissions): no starvation. Admission matches the prefix, locks it and allocates
pages for the first chunk. A request that cannot get a page first evicts the cache's shortfall,
then preempts the running request with the least progress (possibly itself).

Same-prefix arrivals: if the next page a waiting request needs is being prefilled by a running
request, it waits a step (``dedupe_in_flight``) and then reuses those pages. Prefill progress goes
to the cache after every chunk: a long shared prompt is shared as soon as a chunk of it exists.

Pages are the ``PageManager``'s (page_manager.py): the scheduler decides who runs and whom to
preempt, the manager whether the pages are there; each of its verbs does all or nothing.
"""

from __future__ import annotations

from radixray.cache_index import PageAllocator, PrefixCache

from .batch import Batch, ScheduledItem, StepShape
from .packing import StepCosts, StepPacking
from .page_manager import PageManager
from .queued import QueuedPrefill
from .request import Request, RequestStatus
from .scheduler_config import (
    PACKINGS,
    PREFILL_ORDERS,
    SchedulerConfig,
    check_packing,
    check_prefill_order,
)

__all__ = [
    "SchedulerConfig",
    "Scheduler",
    "ScheduledItem",
    "Batch",
    "StepShape",
    "PACKINGS",
    "PREFILL_ORDERS",
    "check_packing",
    "check_prefill_order",
]


class Scheduler:
    def __init__(
        self,
        cache: PrefixCache,
        config: SchedulerConfig | None = None,
        step_costs: StepCosts | None = None,
        state_slots: PageAllocator | None = None,
    ):
        """``step_costs``: what ``packing="priced"`` weighs (``packing.fitted_step_costs``; None
        caps nothing). ``state_slots``: a hybrid's state slots, one per running request."""
        self.config = config or SchedulerConfig()
        self.pages = PageManager(cache, state_slots, self.config.state_interval)
        self.cache = cache
        self.alloc = cache.allocator
        self.P = cache.page_size
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.queued = QueuedPrefill(self.pages, self.waiting, self.running)
        self.load = self.queued.load  # what routers are told (engine and simulator alike)
        self.steps = 0
        self.work = 0  # tokens scheduled over all steps: the clock a request's wait is read on
        self.num_preemptions = 0
        self.step_costs = step_costs
        self._packing = StepPacking(None)  # the step being planned

    @property
    def reuse(self) -> bool:
        """Whether the cache shares prefixes (not a ChunkCache): the page manager's flag."""
        return self.pages.reuse

    @property
    def num_evicted_pages(self) -> int:
        return self.pages.num_evicted_pages

    # ------------------------------------------------------------------ queue

    def add(self, req: Request) -> None:
        capacity = self.alloc.num_pages * self.P
        need = req.num_prompt + req.params.max_tokens
        if need > capacity:
            raise ValueError(
                f"prompt ({req.num_prompt} tokens) + max_tokens ({req.params.max_tokens}) = "
                f"{need} exceeds the KV pool ({self.alloc.num_pages} pages x {self.P} = "
                f"{capacity} tokens)"
            )
        req.arrival_step = self.steps
        req.arrival_work = self.work
        req.status = RequestStatus.WAITING
        self.queued.enqueue(req)
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, request_id: str) -> Request | None:
        """Remove a request wherever it is; its pages go back at once. None if unknown."""
        for i, req in enumerate(self.waiting):
            if req.request_id == request_id:
                del self.waiting[i]
                req.status = RequestStatus.FINISHED
                req.finish_reason = "abort"
                return req
        for req in self.running:
            if req.request_id == request_id:
                self.finish(req, "abort")
                return req
        return None

    def check_integrity(self) -> None:
        """Every page is free, cached or private to exactly one running request."""
        self.pages.check_integrity(self.running, self.waiting)

    # ------------------------------------------------------------------ planning

    def schedule(self) -> Batch:
        self.steps += 1
        budget = self.config.max_batch_tokens
        items: list[ScheduledItem] = []
        scheduled: set[int] = set()
        preemptions_before, running = self.num_preemptions, RequestStatus.RUNNING
        one_order = self.config.prefill_order != "fcfs"  # running and waiting prefills together
        priced = self.config.packing == "priced"
        self._packing = StepPacking(self.step_costs if priced else None, budget)
        order = sorted([(r.in_prefill, r.arrival_step, i, r) for i, r in enumerate(self.running)])
        # (a ScheduledItem made without NamedTuple's Python __new__: a call less per decode)
        make, note, P = tuple.__new__, self._packing.note, self.P
        for in_prefill, _, _, req in order:
            if one_order and in_prefill:
                break  # prefills are ordered with the waiting requests below
            if req.status is not running or budget <= 0 or req.last_pending:
                continue
            if in_prefill:
                budget -= self._continue(req, budget, items, scheduled)
            elif req.num_computed < len(req.pages) * P:  # a decode with its page: inline
                items.append(make(ScheduledItem, (req, req.num_computed, 1, True)))
                scheduled.add(id(req))
                note(True, True)
                budget -= 1
            else:
                budget -= self._decode(req, items, scheduled)
        if one_order and (self.waiting or (order and order[-1][0])):  # a prompt to compute
            self._prefill_in_order(items, budget, scheduled, preemptions_before)
        # No admissions in a step that had to preempt: memory is short, and admitting now would
        # only evict what the preempted request just left in the cache.
        elif budget > 0 and self.waiting and self.num_preemptions == preemptions_before:
            self._admit(items, budget, scheduled)
        batch = Batch(items, self.pages.state_copies(items))
        self.work += batch.num_tokens
        return batch

    def _continue(self, req: Request, budget: int, items: list, scheduled: set[int]) -> int:
        """Schedule a running request's next token or chunk; the tokens it takes (0 if it was
        preempted itself, or capped by ``packing``)."""
        n = req.num_tokens - req.num_computed
        cap = self._room(req, n, budget, scheduled) if req.in_prefill else budget
        n = self.pages.chunk(req, cap)
        if n <= 0 or not self._ensure_pages(req, req.num_computed + n, scheduled):
            return 0
        self._schedule(
            ScheduledItem(req, req.num_computed, n, req.num_computed + n == req.num_tokens),
            items,
            scheduled,
        )
        return n

    def _decode(self, req: Request, items: list, scheduled: set[int]) -> int:
        """``_continue`` for a request past its prefill: its next token (1), or 0 if it was
        preempted itself (``schedule`` takes one whose page is there inline, as this does)."""
        start = req.num_computed
        if start >= len(req.pages) * self.P and not self._ensure_pages(req, start + 1, scheduled):
            return 0
        items.append(ScheduledItem(req, start, 1, True))
        scheduled.add(id(req))
        self._packing.note(True, True)
        return 1

    def _schedule(self, item: ScheduledItem, items: list, scheduled: set[int]) -> None:
        items.append(item)
        scheduled.add(id(item.req))
        self._packing.note(item.decode, item.sample)

    def _room(self, req: Request, remaining: int, budget: int, scheduled: set[int]) -> int:
        """What of ``budget`` a prefill chunk of ``req`` may take (``packing``), against the
        prompts still waiting for prefill: the waiting ones and the running ones not yet in this
        step (their queued tokens, ``QueuedPrefill``)."""
        if not self._packing.finishing:
            return budget
        others = [r for r in self.running if r.in_prefill and id(r) not in scheduled]
        behind = sum(r.num_tokens - r.num_computed for r in others if r is not req)
        behind += sum(r.queued_tokens for r in self.waiting if r is not req)
        return self._packing.limit(budget, remaining, len(self.waiting) + len(others), behind)

    def _prefill_in_order(
        self, items: list, budget: int, scheduled: set[int], preemptions_before: int
    ) -> None:
        """The prefill part of a step under ``prefill_order="ratio"`` or ``"shortest"``: running
        prefills and waiting requests in one order (``_prefill_rank``)."""
        cfg = self.config
        running = [r for r in self.running if r.in_prefill and id(r) not in scheduled]
        remaining = {id(r): r.num_tokens - r.num_computed for r in running}
        remaining.update(self._uncached(self.waiting))
        order = sorted(running + self.waiting, key=self._prefill_rank(remaining))
        was_running = {id(r) for r in running}
        in_flight = self.queued.in_flight_hashes()
        admitting = True
        for req in order:
            if budget <= 0:
                break
            if id(req) in was_running:
                if req.status is RequestStatus.RUNNING:  # not preempted earlier in this step
                    budget -= self._continue(req, budget, items, scheduled)
                    if self.num_preemptions != preemptions_before:
                        admitting = False  # memory is short: see schedule()
                continue
            if not admitting or len(self.running) >= cfg.max_running:
                continue
            took = self._try_admit(req, budget, in_flight, items, scheduled)
            if took is None:
                admitting = False  # no memory for it: keep the queue order, wait
            else:
                budget -= took

    def _prefill_rank(self, remaining: dict[int, int]):
        """The sort key of the prefill order: what has waited ``max_wait_steps`` first, by
        arrival; the rest by fewest ``remaining`` tokens (``shortest``) or by highest response
        ratio, (waited + remaining) / remaining with the wait in tokens computed since arrival
        (``ratio``), the fewer remaining first among equals."""
        steps, wait, work = self.steps, self.config.max_wait_steps, self.work
        ratio = self.config.prefill_order == "ratio"

        def key(r: Request) -> tuple:
            left = remaining[id(r)]
            if steps - r.arrival_step >= wait:
                return (False, 0, 0, r.arrival_step)
            rank = -(work - r.arrival_work + left) / max(left, 1) if ratio else left
            return (True, rank, left, r.arrival_step)

        return key

    def _uncached(self, waiting: list[Request]) -> dict[int, int]:
        """Each waiting request's tokens left to compute, net of the cached prefix (estimated
        read-only, as the admission order does; past ``lpm_queue_limit`` without the cache)."""
        if len(waiting) > self.config.lpm_queue_limit or not self.reuse:
            return {id(r): r.num_tokens - r.num_computed for r in waiting}
        return {id(r): r.num_tokens - self.pages.peek(r) for r in waiting}

    def _ensure_pages(self, req: Request, upto: int, scheduled: set[int]) -> bool:
        """Give ``req`` pages for positions < ``upto`` (free or evicted ones), else preempt the
        least-progressed running request not yet scheduled this step and try again. False if
        ``req`` itself was the one preempted."""
        while not self.pages.grow(req, upto):
            candidates = [r for r in self.running if id(r) not in scheduled]
            victim = min(candidates, key=lambda r: (r.num_output, r.num_computed, -r.arrival_step))
            self.preempt(victim)
            if victim is req:
                return False
        return True

    def _admission_order(self) -> list[Request]:
        waiting = self.waiting
        if len(waiting) > self.config.lpm_queue_limit or not self.reuse:
            return list(waiting)
        old = [r for r in waiting if self.steps - r.arrival_step >= self.config.max_wait_steps]
        young = [r for r in waiting if self.steps - r.arrival_step < self.config.max_wait_steps]
        if len(young) <= 1:
            return old + young  # nothing to order: skip the matches
        # A read-only estimate from the prompt's page hashes: O(edges) a request, and it leaves
        # the cache's access times and hit counts alone (a real match would count every step a
        # request waits as a hit for LFU). The last token is always computed, so a prompt's
        # last page only counts when more tokens follow it.
        match_len = {id(r): self.pages.peek(r) for r in young}
        young.sort(key=lambda r: -match_len[id(r)])  # stable: FCFS among equals
        return old + young

    def _admit(self, items: list[ScheduledItem], budget: int, scheduled: set[int]) -> None:
        cfg = self.config
        in_flight = self.queued.in_flight_hashes()
        for req in self._admission_order():
            if budget <= 0 or len(self.running) >= cfg.max_running:
                break
            took = self._try_admit(req, budget, in_flight, items, scheduled)
            if took is None:
                break  # not enough memory for this one: keep the queue order, wait
            budget -= took

    def _try_admit(
        self,
        req: Request,
        budget: int,
        in_flight: set[int],
        items: list[ScheduledItem],
        scheduled: set[int],
    ) -> int | None:
        """Admit ``req`` with its first chunk of up to ``budget`` tokens: the tokens scheduled,
        0 if it defers to a running request that is computing its next page, None if its pages
        do not fit (nothing changed). 0 too when priced packing leaves it to the next step."""
        P, cfg = self.P, self.config
        if req.pending:  # preempted while its last token is on the device (overlap.py)
            return 0
        if self._packing.finishing:  # read-only: a deferred request is no cache hit
            remaining = req.num_tokens - min(self.pages.peek(req), req.num_tokens - 1)
            budget = self._room(req, remaining, budget, scheduled)
            if budget <= 0:
                return 0
        m = self.pages.match(req)
        nxt = len(m.pages) + len(m.host_pages)
        if (
            cfg.dedupe_in_flight
            and self.reuse
            and not req.needs_prompt_logits
            and nxt < len(req.block_hashes)
            and req.block_hashes[nxt] in in_flight
            and req.deferred_steps < cfg.max_wait_steps
        ):
            req.deferred_steps += 1  # wait for the running request to cache it
            return 0
        start = self.pages.admit_first(req, m, budget)
        if start is None:
            return None
        if req.miss is None:  # not loaded: ``start`` (a state cache's device part, perhaps)
            m = start if start.num_tokens <= m.num_tokens else m
            req.miss = self.pages.attribute(req, m, in_flight, start.num_tokens - m.num_tokens)
        req.status = RequestStatus.RUNNING
        self.waiting.remove(req)
        self.running.append(req)
        in_flight.update(req.block_hashes[nxt : req.num_prompt // P])
        s, n = start.num_tokens, self.pages.chunk(req, budget)  # (num_computed is s)
        self._schedule(ScheduledItem(req, s, n, s + n == req.num_tokens), items, scheduled)
        return n

    # ------------------------------------------------------------------ after a step

    def postprocess(self, batch: Batch) -> None:
        """Record computed tokens; hand finished prefill chunks to the cache so other requests
        can share them at once."""
        window, running = self.pages.window is not None, RequestStatus.RUNNING
        for it in batch.items:
            req = it.req
            if req.status is not running:
                continue
            req.num_computed = it.start + it.num_tokens
            if it.num_tokens > 1:
                self.pages.commit(req, req.num_computed)
            if window:
                self.pages.trim_window(req)  # pages out of its window go back

    def fork(self, src: Request, dst: Request) -> list[tuple[int, int]] | None:
        """Start ``dst``, another sample of ``src``'s prompt, where ``src`` is now: running,
        with ``src``'s cached pages shared and its private ones copied (the (source, copy) page
        pairs returned, for the KV copy before the next step). None when there is no room
        (``max_running`` or memory): then ``dst`` waits at the front of the queue, to be
        admitted as any request (its prompt matching ``src``'s cached pages)."""
        dst.arrival_step, dst.arrival_work = src.arrival_step, src.arrival_work
        if len(self.running) < self.config.max_running:
            pairs = self.pages.fork(src, dst)
            if pairs is not None:
                dst.status = RequestStatus.RUNNING
                self.running.append(dst)
                return pairs
        dst.status = RequestStatus.WAITING
        self.queued.enqueue(dst)
        self.waiting.insert(0, dst)
        return None

    def preempt(self, req: Request) -> None:
        """Stop ``req``, keep its computed prefix in the cache, requeue it at the front."""
        self.pages.release(req)
        req.num_computed = 0
        req.status = RequestStatus.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.running.remove(req)
        self.queued.enqueue(req)
        self.waiting.insert(0, req)

    def finish(self, req: Request, reason: str) -> None:
        """End ``req``: running, or waiting after a preemption that came while its last token
        was still on the device (``overlap.py``)."""
        self.pages.release(req)
        (self.running if req.status is RequestStatus.RUNNING else self.waiting).remove(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
