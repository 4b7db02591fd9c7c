"""cache_aware_v03: SGLang's router's rule as ``sglang-router`` 0.3 (January 2026) decided.

Kept one release beside ``cache_aware`` (smg 1.13.0's rule, ``smg.py``) for the simulator's
old-vs-new table; delete it after.

Per request, with ``load`` = outstanding requests per healthy worker::

    imbalanced = max(load) - min(load) > balance_abs_threshold
                 and max(load) > balance_rel_threshold * min(load)
    if imbalanced:                          -> the least loaded worker (shortest queue)
    elif best match / prompt > cache_threshold -> the worker with the longest cached prefix
    else:                                   -> the least loaded worker (SGLang since
                                               sgl-project/sglang PR #14650)

Defaults are SGLang's: ``cache_threshold=0.3``, ``balance_abs_threshold=64``,
``balance_rel_threshold=1.5``. SGLang keeps its own approximate radix tree of text per worker; we
use the shared ``ApproxIndex`` (blocks per worker, bounded) for the match.

``cache_aware_smallest_cache`` (``fallback="smallest_cache"``) is SGLang's rule before that PR:
a low match went to the worker with the smallest cache (``get_smallest_tenant``). Kept to
measure against, and to show why it went: with an index kept exact by KV events the smallest
cache is the *busiest* worker (in-flight requests hold private pages, not cached ones), so the
fallback sends new prompts to the worker least able to take them.

Ties: the longest match prefers the less loaded worker, then the first in the order given; the
shortest queue and the smallest cache pick the first in the order given (SGLang's ``min_by_key``).
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import Decision, Policy, RoutingRequest, WorkerState, healthy, register_policy

__all__ = ["CacheAwareV03", "CacheAwareSmallestCache"]


@register_policy("cache_aware_v03")
class CacheAwareV03(Policy):
    def __init__(
        self,
        seed: int | None = 0,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
        fallback: str = "least_load",
    ):
        super().__init__(seed)
        if not 0.0 <= cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {cache_threshold}")
        if fallback not in ("smallest_cache", "least_load"):
            raise ValueError(f"fallback must be 'smallest_cache' or 'least_load', got {fallback!r}")
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.fallback = fallback

    def choose(self, request: RoutingRequest, workers: Sequence[WorkerState], index) -> Decision:
        live = healthy(workers)
        loads = [w.load for w in live]
        hi, lo = max(loads), min(loads)
        if hi - lo > self.balance_abs_threshold and hi > self.balance_rel_threshold * lo:
            best = live[loads.index(lo)]
            return Decision(best.worker_id, "cache_aware_v03: imbalanced -> shortest queue")
        matched = index.match(request.block_hashes) if request.block_hashes else {}
        top = max(live, key=lambda w: (matched.get(w.worker_id, 0), -w.load))
        top_blocks = matched.get(top.worker_id, 0)
        cached = top_blocks * index.page_size
        scores = {w.worker_id: matched.get(w.worker_id, 0) for w in live}
        if request.num_tokens and cached / request.num_tokens > self.cache_threshold:
            return Decision(top.worker_id, "cache_aware_v03: longest match", cached, scores)
        if self.fallback == "least_load":
            best = live[loads.index(lo)]
            reason = "cache_aware_v03: low match -> least load"
        else:
            best = min(live, key=lambda w: index.num_blocks(w.worker_id))
            reason = "cache_aware_v03: low match -> smallest cache"
        return Decision(
            best.worker_id,
            reason,
            matched.get(best.worker_id, 0) * index.page_size,
            scores,
        )


@register_policy("cache_aware_smallest_cache")
class CacheAwareSmallestCache(CacheAwareV03):
    """SGLang's cache_aware before PR #14650: a low match goes to the smallest cache."""

    def __init__(self, seed: int | None = 0, **kwargs):
        super().__init__(seed, **({"fallback": "smallest_cache"} | kwargs))
