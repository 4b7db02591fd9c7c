"""Engine counters: hit rate, tokens by miss cause, throughput (EWMA), preemptions."""

from __future__ import annotations

import time
from collections import deque

from radixray.numbers import Ewma
from radixray.protocol import MISS_CAUSES, LoadReport, WorkerCounters
from radixray.step_cost import StepCostModel, decode_seq_seconds
from radixray.sysinfo import cpu_model

from .packing import fitted_step_costs

__all__ = ["EngineStats", "STEP_FIELDS", "engine_stats", "perf_class", "worker_report"]

# One entry of EngineStats.step_log.
STEP_FIELDS = (
    "decode_batch", "decode_ctx", "prefill_tokens", "prefill_ctx_sum", "seconds", "period_s",
)  # fmt: skip


class EngineStats:
    def __init__(self):
        self.started = time.monotonic()
        self.requests_finished = 0
        self.requests_aborted = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.miss_tokens = dict.fromkeys(MISS_CAUSES, 0)
        self.steps = 0
        self.prefill_tokens = 0
        self.decode_tokens = 0
        self.prefill_cost = StepCostModel()  # steps that prefill (chunks of mixed steps), by period
        self.decode_step_time = Ewma()  # period of a step that is decode only
        self.decode_rate = Ewma()  # tokens/s of decode-only steps
        # decode-only steps' period against their batch: what one more sequence adds to a step
        self.decode_cost = StepCostModel()
        # tokens a sequence decodes, over the last ~64 that ended (aborted ones included: what
        # they decoded took its steps)
        self.answer_tokens = Ewma(1 / 64)
        # The last steps as (decode_batch, decode_ctx, prefill_tokens, prefill_ctx_sum, seconds,
        # period_s): what a timing model for the simulator is fitted to (radixray.sim.calibrate).
        # ``seconds`` is the forward pass (on CUDA only its launch: the kernels run on after it);
        # ``period_s`` the step's whole share of the engine's time (scheduling, sampling,
        # streaming out, and the wait for the cores when the host is shared: from the previous
        # step's end while the engine had work, else from its start).
        self.step_log: deque[tuple[int, int, int, int, float, float]] = deque(maxlen=16384)
        # The last requests' (prompt_tokens, cached_tokens, seconds from the engine taking the
        # request to its first token): TTFT inside the engine, without the router, the network
        # or the HTTP layers (what the simulator models; bench_sim_vs_live.py compares them).
        self.first_tokens = 0
        self.first_token_log: deque[tuple[int, int, float]] = deque(maxlen=16384)
        # The host tier's copies: pages and bytes each way, seconds, and the load-back cost fit
        # (overhead + bytes / rate, per batch of copies before a forward).
        self.bytes_to_host = 0
        self.bytes_from_host = 0
        self.copy_seconds = 0.0
        self.load_cost = StepCostModel()

    def record_admission(self, prompt_tokens: int, miss: dict[str, int]) -> None:
        self.prompt_tokens += prompt_tokens
        for k, v in miss.items():
            self.miss_tokens[k] += v

    def record_step(self, shape, seconds: float, period_s: float | None = None) -> None:
        """One step of ``shape`` (a scheduler ``StepShape``) took ``seconds`` of forward pass
        and ``period_s`` of the engine's time (default: ``seconds``)."""
        decode_tokens, _, prefill_tokens, _ = shape
        period = seconds if period_s is None else period_s
        self.step_log.append((*shape, seconds, period))
        self.steps += 1
        self.prefill_tokens += prefill_tokens
        self.decode_tokens += decode_tokens
        # The costs a router prices time with are of the step's whole period, not its forward:
        # a queued request waits for the scheduling, sampling and streaming out too, and the
        # rate the queue drains at is tokens per period (on the tiny CPU model past saturation
        # the period was 1.16-1.18x the forward, and a fit of the forward read the fleet's
        # capacity that much too high: benchmarks/HISTORY.md, "Live: at and past saturation").
        if prefill_tokens and period > 0:
            self.prefill_cost.update(prefill_tokens, period)
        elif decode_tokens and period > 0:
            self.decode_step_time.update(period)
            self.decode_rate.update(decode_tokens / period)
            self.decode_cost.update(decode_tokens, period)

    def step_costs(self, decodes: int) -> tuple[float, float] | None:
        """What the scheduler's priced packing weighs (``packing.fitted_step_costs``)."""
        return fitted_step_costs(self.prefill_cost, self.decode_cost, decodes)

    def record_answer(self, tokens: int) -> None:
        """A sequence ended after decoding ``tokens`` tokens (each sample of a request apart)."""
        self.completion_tokens += tokens
        self.answer_tokens.update(tokens)

    def record_copies(self, copies, moved_bytes: int, seconds: float) -> None:
        """One batch of host-tier copies (``host_tier.PageCopy``) moved ``moved_bytes`` in
        ``seconds``."""
        pages_out = sum(len(c.src) for c in copies if c.to_host)
        pages = sum(len(c.src) for c in copies)
        if not pages:
            return
        out = moved_bytes * pages_out // pages
        self.bytes_to_host += out
        self.bytes_from_host += moved_bytes - out
        self.copy_seconds += seconds
        if seconds > 0:
            self.load_cost.update(moved_bytes, seconds)

    def record_first_token(self, prompt_tokens: int, cached_tokens: int, seconds: float) -> None:
        self.first_tokens += 1
        self.first_token_log.append((prompt_tokens, cached_tokens, seconds))

    def steps_since(self, seen: int) -> list[tuple]:
        """The logged steps after the first ``seen`` (as many as the log still holds)."""
        return _since(self.step_log, self.steps, seen)

    def first_tokens_since(self, seen: int) -> list[tuple]:
        """The logged first tokens after the first ``seen``."""
        return _since(self.first_token_log, self.first_tokens, seen)

    @property
    def hit_rate(self) -> float:
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def reused_tokens(self) -> int:
        """Prompt tokens not computed: device hits and host loads."""
        return self.miss_tokens["cached"] + self.miss_tokens["host"]

    def as_dict(self) -> dict:
        fit = self.prefill_cost.fit()
        load_fit = self.load_cost.fit()
        return {
            "requests_finished": self.requests_finished,
            "requests_aborted": self.requests_aborted,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.reused_tokens,
            "hit_rate": self.hit_rate,
            "miss_tokens": dict(self.miss_tokens),
            "steps": self.steps,
            "prefill_tokens": self.prefill_tokens,
            "decode_tokens": self.decode_tokens,
            "prefill_tokens_per_s": fit[1] if fit else None,
            "prefill_overhead_s": fit[0] if fit else None,
            "prefill_fit_moments": tuple(self.prefill_cost.moments),
            "decode_step_s": self.decode_step_time.value,
            "decode_tokens_per_s": self.decode_rate.value,
            "decode_seq_s": decode_seq_seconds(self.decode_cost.moments),
            "decode_fit_moments": tuple(self.decode_cost.moments),
            "answer_tokens": self.answer_tokens.value,
            "bytes_to_host": self.bytes_to_host,
            "bytes_from_host": self.bytes_from_host,
            "copy_seconds": self.copy_seconds,
            "load_bytes_per_s": load_fit[1] if load_fit else None,
            "load_overhead_s": load_fit[0] if load_fit else None,
        }


def _since(log: deque, total: int, seen: int) -> list[tuple]:
    """The entries of ``log`` (the last of ``total`` appended) after the first ``seen``."""
    k = min(total - seen, len(log))
    return list(log)[-k:] if k > 0 else []


def perf_class(config, device, attention: str) -> str:
    """What sets a worker's speed: workers that share it run at the same speed, so a router
    pools their step-time measurements instead of routing on the noise between them."""
    import torch

    if device.type == "cuda":
        hw = torch.cuda.get_device_name(device)
    else:
        hw = f"{cpu_model()} x{torch.get_num_threads()} threads"
    return " | ".join((config.model, config.dtype, hw, attention))


def engine_stats(engine) -> dict:
    """An engine's counters, load and measured rates in one dict (keys: ``WorkerCounters`` and
    ``LoadReport`` fields, plus ``page_size``)."""
    s = engine.meter.as_dict()
    sched, alloc = engine.scheduler, engine.pool.allocator
    running, waiting, queued, decoding = sched.load()
    s.update(
        running=running,
        # Requests still in the inbox are waiting too: they are accepted, not yet queued.
        waiting=waiting + engine.loop.pending,
        queued_prefill_tokens=queued,
        active_decode_tokens=decoding,
        free_pages=alloc.num_free,
        total_pages=alloc.num_pages,
        cached_pages=engine.cache.total_tokens // engine.page_size,
        evictable_pages=engine.cache.evictable_tokens // engine.page_size,
        page_size=engine.page_size,
        preemptions=sched.num_preemptions,
        evicted_pages=sched.num_evicted_pages,
        kv_bytes_per_token=engine.pool.page_bytes // engine.page_size,
        max_batch_tokens=sched.config.max_batch_tokens,
    )
    if engine.pool.window_k is not None:  # the window layers' pool (docs/window_cache.md)
        s.update(
            window_total_pages=alloc.num_window_pages,
            window_free_pages=alloc.num_window_free,
            window_dropped_pages=sched.pages.num_window_dropped,
            window_evicted_pages=getattr(engine.cache, "num_window_evicted", 0),
        )
    if engine.state_pool is not None:  # a hybrid's state slots (worker/state_pool.py)
        s.update(
            state_total_slots=engine.state_pool.num_slots,
            state_free_slots=engine.state_pool.num_free,
        )
    tier, host_alloc = getattr(engine.cache, "host", None), engine.pool.host_allocator
    if tier is not None and host_alloc is not None:
        s.update(
            host_total_pages=host_alloc.num_pages,
            host_free_pages=tier.spare_pages,  # free, or a copy of a device page: room
            host_cached_pages=host_alloc.num_used,
            demoted_pages=tier.demoted_pages,
            loaded_pages=tier.loaded_pages,
            host_evicted_pages=tier.evicted_pages,
        )
    return s


def worker_report(s: dict) -> tuple[LoadReport, WorkerCounters]:
    """The load and the counters a worker sends in its poll result, from ``engine_stats``."""
    load = LoadReport(**{k: s[k] for k in LoadReport.__struct_fields__ if k in s})
    counters = WorkerCounters(**{k: s[k] for k in WorkerCounters.__struct_fields__ if k in s})
    return load, counters
