"""kv_cost: NVIDIA Dynamo's KV router cost (``--router-mode kv``), temperature 0.

For each healthy worker, in blocks of ``page_size`` tokens::

    prefill_blocks = queued_prefill_tokens / P + (request_blocks - overlap_blocks)
    decode_blocks  = active_decode_tokens / P + request_blocks
    cost           = overlap_score_weight * prefill_blocks + decode_blocks

The lowest cost wins; ties are broken at random (seeded), as Dynamo does at temperature 0.
``overlap_score_weight`` defaults to Dynamo's 1.0 (0 makes it a pure load balancer).
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import Decision, Policy, RoutingRequest, WorkerState, healthy, register_policy

__all__ = ["KvCost"]


@register_policy("kv_cost")
class KvCost(Policy):
    def __init__(self, seed: int | None = 0, overlap_score_weight: float = 1.0):
        super().__init__(seed)
        if overlap_score_weight < 0:
            raise ValueError(f"overlap_score_weight must be >= 0, got {overlap_score_weight}")
        self.overlap_score_weight = overlap_score_weight

    def choose(self, request: RoutingRequest, workers: Sequence[WorkerState], index) -> Decision:
        live = healthy(workers)
        P = index.page_size
        matched = index.match(request.block_hashes) if request.block_hashes else {}
        req_blocks = -(-request.num_tokens // P)
        wgt = self.overlap_score_weight
        scores = {}
        best_cost = None
        best: list[WorkerState] = []
        for w in live:
            overlap = matched.get(w.worker_id, 0)
            prefill = w.queued_prefill_tokens / P + (req_blocks - overlap)
            decode = w.active_decode_tokens / P + req_blocks
            cost = wgt * prefill + decode
            scores[w.worker_id] = cost
            if best_cost is None or cost < best_cost:
                best_cost, best = cost, [w]
            elif cost == best_cost:
                best.append(w)
        pick = best[0] if len(best) == 1 else self.rng.choice(best)
        return Decision(
            pick.worker_id, "kv_cost: lowest cost", matched.get(pick.worker_id, 0) * P, scores
        )
