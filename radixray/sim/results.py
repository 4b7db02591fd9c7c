"""Per-run results of the simulator, and two references for them: the infinite-cache ceiling
of a workload (and the TTFT bound it gives), and the same with the cluster's own cache size (one
pooled LRU cache of all its pages). The second is a reference, not a strict bound: LRU caches
kept apart can hold more useful pages than one LRU cache of their total size."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from radixray.cache_index import PageAllocator, RadixCache, hash_blocks
from radixray.numbers import percentile

from .timing import TimingModel
from .workload import Workload

__all__ = [
    "REFUSED",
    "RequestRecord",
    "RunResult",
    "SUMMARY_KEYS",
    "ceiling",
    "ceiling_hits",
    "percentile",
    "pooled_hits",
    "ttft_bound",
]

# The reason on the record of a request the router's admission refused (a 429; worker -1). It is
# left out of every figure of the served requests and counted in ``refused``.
REFUSED = "refused: admission limit"

SUMMARY_KEYS = (
    "hit_rate",
    "hit_rate_beyond_first_block",
    "ceiling",
    "ttft_p50",
    "ttft_p90",
    "ttft_p99",
    "bound_p50",
    "bound_p90",
    "bound_p99",
    "pooled_hit_rate",
    "pooled_ttft_p50",
    "pooled_ttft_p90",
    "pooled_ttft_p99",
    "throughput",
    "imbalance",
)


def ceiling_hits(workload: Workload, page_size: int) -> list[int]:
    """Each request's hit tokens in one infinite cache that keeps every full page of every
    earlier prompt (and, for chat, of earlier prompt + answer), matching at most the first
    ``num_tokens - 1`` tokens, page-aligned, as a worker does."""
    seen: set[int] = set()
    hits = []
    hashes = workload.block_hashes(page_size)
    for req, hs in zip(workload.requests, hashes, strict=True):
        cap = (req.num_tokens - 1) // page_size
        k = 0
        while k < cap and hs[k] in seen:
            k += 1
        hits.append(k * page_size)
        seen.update(hs)
        if req.output_seg is not None:
            seen.update(hash_blocks(workload.tokens(req) + workload.output_tokens(req), page_size))
    return hits


def pooled_hits(workload: Workload, page_size: int, num_pages: int) -> list[int]:
    """Each request's hit tokens in one LRU radix cache (the worker's own ``RadixCache``) of
    ``num_pages`` pages, into which every earlier request's full pages (prompt, and a chat
    answer) went when it arrived: what the whole cluster's cache could reuse if it were one
    worker's, with nothing in flight. At most the first ``num_tokens - 1`` tokens, page-aligned;
    never above :func:`ceiling_hits` (equal to it when nothing is evicted). Not an upper bound
    on what workers' caches kept apart reuse: LRU is not optimal, and separate caches can keep
    pages that one shared LRU order would evict."""
    P = page_size
    alloc = PageAllocator(num_pages)
    cache = RadixCache(P, alloc, "lru", enable_events=False)
    hits = []
    for req in workload.requests:
        tokens = workload.tokens(req)
        m = cache.match_prefix(tokens)
        hits.append(min(m.num_tokens, (len(tokens) - 1) // P * P))
        seq = tokens + workload.output_tokens(req)
        k = len(seq) // P
        need = k - len(m.pages)
        if need <= 0 or need > num_pages:
            continue  # nothing new, or more than the whole cache
        cache.lock(m.node)
        if alloc.num_free < need:
            cache.evict(need - alloc.num_free)
        cache.unlock(m.node)
        new = alloc.alloc(need)
        if new is None:  # the rest of the cache is this request's own prefix
            continue
        cache.insert(seq[: k * P], m.pages + new, None, hash_blocks(seq[: k * P], P))
    cache.check_integrity()
    return hits


def ceiling(workload: Workload, page_size: int) -> tuple[int, int]:
    """(hit tokens, prompt tokens) of the infinite cache of :func:`ceiling_hits`."""
    return sum(ceiling_hits(workload, page_size)), sum(r.num_tokens for r in workload.requests)


def ttft_bound(
    workload: Workload, page_size: int, timing: TimingModel, hits: list[int] | None = None
) -> list[float]:
    """Each request's TTFT if it hit its whole infinite-cache prefix (:func:`ceiling_hits`, or
    the given ``hits``) on an idle worker: its uncached tokens prefilled alone, in chunks of
    ``max_batch_tokens``, as a simulated worker steps. No routing can do better; what a policy
    adds above it is queueing and recomputation, the part routing can remove (some of that
    recomputation may be the cluster's cache size: the same with :func:`pooled_hits`)."""
    out = []
    chunk = timing.max_batch_tokens
    if hits is None:
        hits = ceiling_hits(workload, page_size)
    for req, hit in zip(workload.requests, hits, strict=True):
        pos, n, t = hit, req.num_tokens, 0.0
        while pos < n:
            c = min(n - pos, chunk)
            t += timing.step_time(0, 0, c, c * pos + c * (c - 1) // 2)
            pos += c
        out.append(t)
    return out


@dataclass
class RequestRecord:
    rid: int
    worker: int
    arrival: float
    prompt_tokens: int
    predicted_cached: int  # the policy's prediction
    reason: str
    cached: int = -1  # delivered
    first_token: float = math.nan
    finish: float = math.nan
    available: int = 0  # the longest prefix any worker held, by the index at decision
    captured: int = 0  # the prefix the chosen worker held, by the index at decision
    # where the TTFT went: before its first step, its steps' forwards, their host-tier copies
    wait_s: float = math.nan
    forward_s: float = math.nan
    copy_s: float = math.nan
    # the term of the policy's cost that separated the winner from the runner-up (ttft), and
    # with SimConfig.explain each candidate's terms: worker -> {term: seconds}
    decided_by: str | None = None
    terms: dict | None = None

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def e2e(self) -> float:
        return self.finish - self.arrival


@dataclass
class RunResult:
    policy: str
    records: list[RequestRecord]
    busy_time: list[float]
    first_block_tokens: int
    ceiling_tokens: int
    index_memory_bytes: int
    index_memory_peak_bytes: int
    wall_s: float = 0.0
    config: dict = field(default_factory=dict)
    oversize: int = 0
    bound: list[float] = field(default_factory=list)  # ttft_bound, per request (same order)
    # the same with the hits of one cache of the cluster's pages (pooled_hits), and those hits
    pooled_ttft: list[float] = field(default_factory=list)
    pooled_tokens: int = 0
    # the host tiers' copies over the run (all workers): pages demoted and loaded back, seconds
    host_copies: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict:
        """Figures of the served requests (all of them unless the run modelled admission),
        ``refused`` the count refused; the bound is the whole workload's."""
        served = [k for k, r in enumerate(self.records) if r.reason != REFUSED]
        recs = [self.records[k] for k in served]
        own_bound = [self.bound[k] for k in served] if self.bound else []
        prompt = sum(r.prompt_tokens for r in recs)
        # the references are the whole workload's: over every request's prompt
        whole = sum(r.prompt_tokens for r in self.records)
        cached = sum(r.cached for r in recs)
        fb = self.first_block_tokens
        beyond_prompt = sum(max(r.prompt_tokens - fb, 0) for r in recs)
        beyond_cached = sum(max(r.cached - fb, 0) for r in recs)
        ttfts = [r.ttft for r in recs]
        start = min((r.arrival for r in recs), default=0.0)
        end = max((r.finish for r in recs), default=0.0)
        span = end - start
        busy = self.busy_time
        mean_busy = sum(busy) / len(busy) if busy else 0.0
        bound = {f"bound_p{q}": percentile(self.bound, q) for q in (50, 90, 99)}
        # Every request's TTFT is at least its own bound, so each percentile is too (up to
        # rounding: clamped at 0).
        excess = {
            f"excess_p{q}": max(0.0, percentile(ttfts, q) - bound[f"bound_p{q}"])
            for q in (50, 90, 99)
        }
        # Per request: how much later than its own bound its first token came. The excess
        # above compares two distributions at one percentile (the requests at TTFT's median
        # need not be those at the bound's); this asks what the request at each percentile of
        # delay waited beyond what it could have.
        delays = [max(0.0, r.ttft - b) for r, b in zip(recs, own_bound, strict=True)]
        delay = {f"delay_p{q}": percentile(delays, q) for q in (50, 90, 99)}
        pooled: dict[str, float] = {}
        if self.pooled_ttft:
            pooled["pooled_hit_rate"] = self.pooled_tokens / whole if whole else 0.0
            for q in (50, 90, 99):
                b = percentile(self.pooled_ttft, q)
                pooled[f"pooled_ttft_p{q}"] = b
                pooled[f"pooled_excess_p{q}"] = max(0.0, percentile(ttfts, q) - b)
        return {
            "requests": len(recs),
            "refused": len(self.records) - len(recs),
            "hit_rate": cached / prompt if prompt else 0.0,
            "hit_rate_beyond_first_block": beyond_cached / beyond_prompt if beyond_prompt else 0.0,
            "ceiling": self.ceiling_tokens / whole if whole else 0.0,
            # reuse telemetry, as fractions of prompt tokens: available >= captured always;
            # delivered above or below captured is the index's error, counted both ways
            "reuse_available": sum(r.available for r in recs) / prompt if prompt else 0.0,
            "reuse_captured": sum(r.captured for r in recs) / prompt if prompt else 0.0,
            "reuse_over": sum(max(r.captured - r.cached, 0) for r in recs) / prompt
            if prompt
            else 0.0,
            "reuse_under": sum(max(r.cached - r.captured, 0) for r in recs) / prompt
            if prompt
            else 0.0,
            "ttft_mean": sum(ttfts) / len(ttfts) if ttfts else float("nan"),
            "ttft_p50": percentile(ttfts, 50),
            "ttft_p90": percentile(ttfts, 90),
            "ttft_p99": percentile(ttfts, 99),
            **bound,
            **excess,
            **delay,
            "delay_mean": sum(delays) / len(delays) if delays else float("nan"),
            **pooled,
            "e2e_p50": percentile([r.e2e for r in recs], 50),
            "throughput": len(recs) / span if span > 0 else 0.0,
            "token_throughput": prompt / span if span > 0 else 0.0,
            "imbalance": max(busy) / mean_busy if mean_busy > 0 else 1.0,
            "index_memory_bytes": self.index_memory_bytes,
            "index_memory_peak_bytes": self.index_memory_peak_bytes,
            "oversize_requests": self.oversize,
            "sim_wall_s": self.wall_s,
        }

    def goodput(self, slo_s: float) -> float:
        """The share of all arrivals whose first token came within ``slo_s`` of their arrival at
        the router (queueing and prefill included); a refused request is a miss, whether or not
        its client would retry."""
        if not self.records:
            return 0.0
        good = sum(1 for r in self.records if r.reason != REFUSED and r.ttft <= slo_s)
        return good / len(self.records)

    def per_worker(self) -> dict[str, list]:
        n = len(self.busy_time)
        reqs = [0] * n
        toks = [0] * n
        for r in self.records:
            if r.reason == REFUSED:
                continue
            reqs[r.worker] += 1
            toks[r.worker] += r.prompt_tokens - r.cached
        return {"busy_s": list(self.busy_time), "requests": reqs, "prefill_tokens": toks}
