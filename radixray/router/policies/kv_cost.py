"""kv_cost: NVIDIA Dynamo's KV router cost (``--router-mode kv``), temperature 0.

For each healthy worker, in blocks of ``page_size`` tokens::

    prefill_blocks = queued_prefill_tokens / P + (request_blocks - overlap_blocks)
    decode_blocks  = (active_decode_tokens + queued_prefill_tokens) / P + request_blocks
    cost           = overlap_score_weight * prefill_blocks + decode_blocks

Dynamo's active blocks are those of every request routed to the worker and not yet finished
(its router adds a request's blocks when it routes it), so requests still queued or mid-prefill
count as well as the decoding ones. A worker's report carries the decoding requests' context
(``active_decode_tokens``) and the others' tokens still to prefill (``queued_prefill_tokens``),
so those two stand for its active blocks; what they leave out is the cached prefix of a request
not yet decoding, and Dynamo counts a block that requests share once where the sum counts it per
request.

The lowest cost wins; ties are broken at random (seeded), as Dynamo does at temperature 0.
``overlap_score_weight`` defaults to Dynamo's 1.0 (0 makes it a pure load balancer).

With host tiers a worker's overlap counts its device blocks whole and the blocks it would load
back from its host tier at ``host_block_weight`` each: Dynamo's default 0.75 (llm-d's scorer
weighs them 0.8); 0 makes the policy tier-blind. A fixed discount, not a time: the pricing
this policy stands for as a baseline.
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import Decision, Policy, RoutingRequest, WorkerState, healthy, register_policy

__all__ = ["KvCost"]


@register_policy("kv_cost")
class KvCost(Policy):
    def __init__(
        self,
        seed: int | None = 0,
        overlap_score_weight: float = 1.0,
        host_block_weight: float = 0.75,
    ):
        super().__init__(seed)
        if overlap_score_weight < 0:
            raise ValueError(f"overlap_score_weight must be >= 0, got {overlap_score_weight}")
        if not 0.0 <= host_block_weight <= 1.0:
            raise ValueError(f"host_block_weight must be in [0, 1], got {host_block_weight}")
        self.overlap_score_weight = overlap_score_weight
        self.host_block_weight = host_block_weight

    def choose(self, request: RoutingRequest, workers: Sequence[WorkerState], index) -> Decision:
        live = healthy(workers)
        P = index.page_size
        tiers = index.match_tiers(request.block_hashes) if request.block_hashes else {}
        hw = self.host_block_weight
        overlap = {w: dev + hw * (both - dev) for w, (dev, both) in tiers.items()}
        matched = {w: dev for w, (dev, _) in tiers.items() if dev}
        req_blocks = -(-request.num_tokens // P)
        wgt = self.overlap_score_weight

        def cost(w: WorkerState) -> float:
            prefill = w.queued_prefill_tokens / P + (req_blocks - overlap.get(w.worker_id, 0))
            active = (w.active_decode_tokens + w.queued_prefill_tokens) / P
            return wgt * prefill + active + req_blocks

        best, scores = self.lowest(live, [cost(w) for w in live])
        pick = self.pick_tied(best, request.fleet)
        cached = matched.get(pick.worker_id, 0) * P
        return Decision(pick.worker_id, "kv_cost: lowest cost", cached, scores, tiers=tiers)
