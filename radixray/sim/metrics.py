"""Per-run results of the simulator and the infinite-cache ceiling of a workload."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from radixray.cache_index import hash_blocks
from radixray.numbers import percentile

from .workload import Workload

__all__ = ["RequestRecord", "RunResult", "ceiling", "percentile", "SUMMARY_KEYS"]

SUMMARY_KEYS = (
    "hit_rate",
    "hit_rate_beyond_first_block",
    "ceiling",
    "ttft_p50",
    "ttft_p90",
    "ttft_p99",
    "throughput",
    "imbalance",
)


def ceiling(workload: Workload, page_size: int) -> tuple[int, int]:
    """(hit tokens, prompt tokens) of one infinite cache that keeps every full page of every
    earlier prompt (and, for chat, of earlier prompt + answer), matching at most the first
    ``num_tokens - 1`` tokens, page-aligned, as a worker does."""
    seen: set[int] = set()
    hit = total = 0
    hashes = workload.block_hashes(page_size)
    for req, hs in zip(workload.requests, hashes, strict=True):
        n = req.num_tokens
        total += n
        cap = (n - 1) // page_size
        k = 0
        while k < cap and hs[k] in seen:
            k += 1
        hit += k * page_size
        seen.update(hs)
        if req.output_seg is not None:
            seen.update(hash_blocks(workload.tokens(req) + workload.output_tokens(req), page_size))
    return hit, total


@dataclass
class RequestRecord:
    rid: int
    worker: int
    arrival: float
    prompt_tokens: int
    predicted_cached: int
    reason: str
    cached: int = -1
    first_token: float = math.nan
    finish: float = math.nan

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

    def summary(self) -> dict:
        recs = self.records
        prompt = sum(r.prompt_tokens for r in recs)
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
        return {
            "requests": len(recs),
            "hit_rate": cached / prompt if prompt else 0.0,
            "hit_rate_beyond_first_block": beyond_cached / beyond_prompt if beyond_prompt else 0.0,
            "ceiling": self.ceiling_tokens / prompt if prompt else 0.0,
            "ttft_mean": sum(ttfts) / len(ttfts) if ttfts else float("nan"),
            "ttft_p50": percentile(ttfts, 50),
            "ttft_p90": percentile(ttfts, 90),
            "ttft_p99": percentile(ttfts, 99),
            "e2e_p50": percentile([r.e2e for r in recs], 50),
            "throughput": len(recs) / span if span > 0 else 0.0,
            "token_throughput": prompt / span if span > 0 else 0.0,
            "imbalance": max(busy) / mean_busy if mean_busy > 0 else 1.0,
            "index_memory_bytes": self.index_memory_bytes,
            "index_memory_peak_bytes": self.index_memory_peak_bytes,
            "oversize_requests": self.oversize,
            "sim_wall_s": self.wall_s,
        }

    def per_worker(self) -> dict[str, list]:
        n = len(self.busy_time)
        reqs = [0] * n
        toks = [0] * n
        for r in self.records:
            reqs[r.worker] += 1
            toks[r.worker] += r.prompt_tokens - r.cached
        return {"busy_s": list(self.busy_time), "requests": reqs, "prefill_tokens": toks}
