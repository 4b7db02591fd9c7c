"""A simulated worker: a real RadixCache over a page allocator, a continuous-batching scheduler
with chunked prefill, and a timing model instead of a model.

Per request (page ownership follows ``radixray.cache_index.prefix_cache``)::

    enqueue      estimate its uncached tokens (a cache lookup) -> waiting
    admit        match_prefix(prompt[:-1]) and lock; allocate private pages for the rest of
                 the prompt and the whole output (reserved up front); evict the shortfall first;
                 a request that cannot get its pages waits (FCFS, head of line)
    prefill      chunks of at most the step's token budget, alongside the decoding requests
    first token  insert the prompt's full pages (free private duplicates that another request
                 cached meanwhile), re-match and lock the prompt, unlock the admission match
    finish       (chat) insert prompt + answer; free the remaining private pages; unlock

A waiting request whose next uncached block is being prefilled right now by another request here
is held back until that prefill ends, so same-prefix arrivals do not all compute it cold.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from radixray.cache_index import PageAllocator, RadixCache
from radixray.router.policies import WorkerState
from radixray.step_cost import StepCostModel

from .timing import TimingModel
from .workload import SimRequest, Workload

__all__ = ["SimWorker", "ReqState"]

# EWMA decay per step for the worker's measured rates: ~10 steps of memory, long enough to
# smooth single steps, short enough to follow a change of batch size within a second or two.
_EWMA = 0.9


class ReqState:
    """Per-run state of one request on one worker."""

    __slots__ = (
        "req",
        "hashes",
        "tokens",
        "est_uncached",
        "cached",
        "pos",
        "node",
        "pages",
        "n_cache_pages",
        "left",
        "ctx",
        "oversize",
    )

    def __init__(self, req: SimRequest, hashes: list[int]):
        self.req = req
        self.hashes = hashes
        self.tokens: list[int] | None = None
        self.est_uncached = req.num_tokens
        self.cached = 0  # tokens reused at admission
        self.pos = 0  # prompt tokens computed or reused so far
        self.node = None  # locked cache node
        self.pages: list[int] = []  # page i holds tokens [i*P, (i+1)*P)
        self.n_cache_pages = 0  # leading pages owned by the cache (the rest are private)
        self.left = 0  # output tokens still to generate
        self.ctx = 0  # context length while decoding
        self.oversize = False


class SimWorker:
    """One worker. The simulator calls ``enqueue`` and ``step_end``; both return the duration of
    the step they started (None: the worker is idle or already busy)."""

    def __init__(
        self,
        worker_id: int,
        num_pages: int,
        page_size: int,
        timing: TimingModel,
        workload: Workload,
        eviction: str = "lru",
        enable_events: bool = True,
        on_first_token: Callable[[ReqState, float], None] | None = None,
        on_finish: Callable[[ReqState, float], None] | None = None,
    ):
        self.worker_id = worker_id
        self.P = page_size
        self.timing = timing
        self.workload = workload
        self.allocator = PageAllocator(num_pages)
        self.cache = RadixCache(page_size, self.allocator, eviction, enable_events=enable_events)
        self.on_first_token = on_first_token
        self.on_finish = on_finish
        self.waiting: deque[ReqState] = deque()
        self.prefilling: list[ReqState] = []
        self.decoding: list[ReqState] = []
        self.busy = False
        self.busy_time = 0.0
        self.steps = 0
        self.queued_prefill = 0  # est. uncached tokens of waiting + what prefilling has left
        self.decode_ctx = 0
        self.inflight: dict[int, int] = {}  # block hash -> prefills computing it now
        self._step_chunks: list[tuple[ReqState, int]] = []
        self._step_decode = 0
        # Measured as the engine measures them (radixray.step_cost), seeded from the timing
        # model as a warm-up benchmark would: a few prefill steps of different sizes.
        self.prefill_cost = StepCostModel()
        for tokens in {max(1, timing.max_batch_tokens // 8), timing.max_batch_tokens}:
            self.prefill_cost.update(tokens, timing.step_time(0, 0, tokens, 0))
        self._decode_step = timing.step_time(1, 0, 0, 0)
        self.oversize = 0

    # ------------------------------------------------------------------ state for the router

    def state(self, prefill_fit: tuple[float, float] | None = None) -> WorkerState:
        """The report a router would see. ``prefill_fit`` = (overhead_s, tokens_per_s) pooled
        over the workers of this worker's class, as the live router pools them; by default this
        worker's own fit."""
        overhead, rate = prefill_fit or self.prefill_cost.fit()
        return WorkerState(
            worker_id=self.worker_id,
            running=len(self.prefilling) + len(self.decoding),
            waiting=len(self.waiting),
            queued_prefill_tokens=self.queued_prefill,
            active_decode_tokens=self.decode_ctx,
            free_pages=self.allocator.num_free,  # holding nothing, as the engine reports it
            total_pages=self.allocator.num_pages,
            prefill_tokens_per_s=rate,
            prefill_overhead_s=overhead,
            decode_step_s=self._decode_step,
        )

    # ------------------------------------------------------------------ arrivals

    def enqueue(self, req: SimRequest, hashes: list[int], now: float) -> float | None:
        st = ReqState(req, hashes)
        st.tokens = self.workload.tokens(req)
        # What a real scheduler knows of its queue: a lookup (no lock) of the current cache.
        n = req.num_tokens
        m = self.cache.match_prefix(st.tokens[: n - 1]).num_tokens if n > 1 else 0
        st.est_uncached = n - m
        self.queued_prefill += st.est_uncached
        self.waiting.append(st)
        if not self.busy:
            return self._start_step()
        return None

    # ------------------------------------------------------------------ scheduling

    def _admit(self, st: ReqState) -> bool:
        """Match, lock and allocate; False (and nothing changed) when the pages are not there."""
        P = self.P
        req = st.req
        n = req.num_tokens
        total_pages = -(-(n + req.output_len) // P)
        if total_pages > self.allocator.num_pages:
            # Can never fit: compute it without caching (counted in stats).
            st.oversize = True
            self.oversize += 1
            self._set_queued(st, n)
            return True
        tokens = st.tokens
        match = self.cache.match_prefix(tokens[: n - 1]) if n > 1 else None
        m_pages = len(match.pages) if match else 0
        need = total_pages - m_pages
        if match:
            self.cache.lock(match.node)
        short = need - self.allocator.num_free
        if short > 0:
            self.cache.evict(short)
        private = self.allocator.alloc(need)
        if private is None:
            if match:
                self.cache.unlock(match.node)
            return False
        st.node = match.node if match else None
        st.pages = (match.pages if match else []) + private
        st.n_cache_pages = m_pages
        st.cached = st.pos = m_pages * P
        self._set_queued(st, n - st.cached)
        return True

    def _set_queued(self, st: ReqState, uncached: int) -> None:
        self.queued_prefill += uncached - st.est_uncached
        st.est_uncached = uncached

    def _blocked_by_inflight(self, st: ReqState) -> bool:
        if not self.inflight or not self.prefilling:
            return False
        hashes = st.hashes
        if not hashes:
            return False
        n = len(self.cache.match_prefix(st.tokens[: len(hashes) * self.P]).pages)
        return n < len(hashes) and hashes[n] in self.inflight

    def _start_step(self) -> float | None:
        t = self.timing
        decode = len(self.decoding)
        budget = max(t.max_batch_tokens - decode, 1)
        chunks: list[tuple[ReqState, int]] = []
        ctx_sum = 0
        for st in self.prefilling:
            if budget <= 0:
                break
            c = min(st.req.num_tokens - st.pos, budget)
            chunks.append((st, c))
            ctx_sum += c * st.pos + c * (c - 1) // 2
            budget -= c
        # Admit new requests into the rest of the budget (FCFS; a request held back by an
        # in-flight prefix is skipped, a request without pages stops admission).
        if budget > 0 and self.waiting:
            held: list[ReqState] = []
            while budget > 0 and self.waiting and decode + len(self.prefilling) < t.max_running:
                st = self.waiting[0]
                if self._blocked_by_inflight(st):
                    held.append(self.waiting.popleft())
                    continue
                if not self._admit(st):
                    break
                self.waiting.popleft()
                self.prefilling.append(st)
                if not st.oversize:
                    inflight = self.inflight
                    for h in st.hashes[st.pos // self.P :]:
                        inflight[h] = inflight.get(h, 0) + 1
                c = min(st.req.num_tokens - st.pos, budget)
                chunks.append((st, c))
                ctx_sum += c * st.pos + c * (c - 1) // 2
                budget -= c
            if held:
                self.waiting.extendleft(reversed(held))
        prefill_tokens = sum(c for _, c in chunks)
        if not chunks and not decode:
            self.busy = False
            return None
        dt = t.step_time(decode, self.decode_ctx, prefill_tokens, ctx_sum)
        self._step_chunks = chunks
        self._step_decode = decode
        self.busy = True
        self.busy_time += dt
        self.steps += 1
        if prefill_tokens:
            self.prefill_cost.update(prefill_tokens, dt)
        if decode:
            self._decode_step = _EWMA * self._decode_step + (1 - _EWMA) * dt
        return dt

    # ------------------------------------------------------------------ step completion

    def step_end(self, now: float) -> float | None:
        # Decoding requests each got one token.
        if self._step_decode:
            still = []
            for st in self.decoding[: self._step_decode]:
                st.left -= 1
                st.ctx += 1
                self.decode_ctx += 1
                if st.left <= 0:
                    self._finish(st, now)
                else:
                    still.append(st)
            self.decoding = still + self.decoding[self._step_decode :]
        done = []
        for st, c in self._step_chunks:
            st.pos += c
            self.queued_prefill -= c
            st.est_uncached -= c
            if st.pos >= st.req.num_tokens:
                done.append(st)
        for st in done:
            self.prefilling.remove(st)
            self._prefill_done(st, now)
        self._step_chunks = []
        return self._start_step()

    def _prefill_done(self, st: ReqState, now: float) -> None:
        P = self.P
        n = st.req.num_tokens
        if not st.oversize:
            inflight = self.inflight
            for h in st.hashes[st.cached // P :]:
                k = inflight[h] - 1
                if k:
                    inflight[h] = k
                else:
                    del inflight[h]
            full = n // P
            if full:
                self._insert(st, st.tokens[: full * P], full)
                match = self.cache.match_prefix(st.tokens[: full * P])
                self.cache.lock(match.node)
                if st.node is not None:
                    self.cache.unlock(st.node)
                st.node = match.node
                st.pages[:full] = match.pages
                st.n_cache_pages = full
        if self.on_first_token:
            self.on_first_token(st, now)
        st.left = st.req.output_len - 1
        st.ctx = n + 1
        if st.left <= 0:
            self._finish(st, now)
        else:
            self.decoding.append(st)
            self.decode_ctx += st.ctx

    def _insert(self, st: ReqState, tokens: list[int], full: int) -> None:
        """Insert ``tokens`` (``full`` pages) and free the private duplicates the cache refused."""
        k = st.n_cache_pages
        already = self.cache.insert(tokens, st.pages[:full]) // self.P
        if already > k:
            self.allocator.free(st.pages[k:already])
            # Those positions now belong to the cache (the caller re-matches to get its pages).
            st.pages[k:already] = [-1] * (already - k)
        st.n_cache_pages = max(k, full)

    def _finish(self, st: ReqState, now: float) -> None:
        if st in self.decoding:
            self.decode_ctx -= st.ctx
        if not st.oversize:
            P = self.P
            req = st.req
            if req.output_seg is not None:
                tokens = st.tokens + self.workload.output_tokens(req)
                full = len(tokens) // P
                if full > st.n_cache_pages:
                    self._insert(st, tokens[: full * P], full)
            self.allocator.free([p for p in st.pages[st.n_cache_pages :] if p >= 0])
            if st.node is not None:
                self.cache.unlock(st.node)
            st.pages = []
            st.node = None
        st.tokens = None
        if self.on_finish:
            self.on_finish(st, now)

    # ------------------------------------------------------------------ checks

    def held_pages(self) -> list[int]:
        out = []
        for st in (*self.prefilling, *self.decoding):
            out += [p for p in st.pages[st.n_cache_pages :] if p >= 0]
        return out

    def check_integrity(self) -> None:
        self.cache.check_integrity(self.held_pages())
