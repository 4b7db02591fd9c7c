"""kv_cost: NVIDIA Dynamo's KV router cost (``--router-mode kv``) as its current code computes it.

Read from ai-dynamo/dynamo at commit 2a6da14c (2026-08-21, workspace 1.5.0; release 1.6.1 has the
same Python defaults): ``lib/kv-router/src/scheduling/selector.rs`` (the cost) and
``lib/kv-router/src/sequences/`` (the active-block accounting). For each healthy worker, in blocks
of ``page_size`` tokens, with ``overlap`` the blocks of the prompt's prefix the index holds there::

    prefill_blocks = max(0, (booked_prefill_tokens + prompt_tokens) / P
                            - overlap_score_credit * overlap)
    decode_blocks  = active_blocks + new_blocks
    cost           = prefill_load_scale * prefill_blocks + decode_blocks

The lowest cost wins; ties go to a random one (seeded here; Dynamo's is unseeded), as at
Dynamo's default temperature 0.

The load is the router's own booking, not the workers' reports:

- **Routed**: the chosen worker books the request's prefill, ``prompt_tokens - overlap * P``
  tokens, and its full blocks as *active*. Active blocks are counted once per worker however
  many requests hold them (a prefix shared by requests in flight is one set of blocks).
- **First token**: its prefill is done; its booked prefill tokens are released.
- **Finished**: its active blocks are released.

``new_blocks`` is the request's full blocks less the depth to which its block chain matches
blocks already active on that worker: a block only in the worker's *cache* still counts as new
(the cache overlap lowers only the prefill term). With ``assume_kv_reuse=False`` (Dynamo's
``router_assume_kv_reuse``, on by default) no block is shared: every request adds all of its
blocks.

Defaults are Dynamo's: ``overlap_score_credit = prefill_load_scale = 1``. Dynamo's router queue
(``router_queue_threshold``) is off by default since its PR #11599 and is not modelled; neither
are its worker-busy thresholds (off by default).

With host tiers a worker's overlap counts its device blocks whole and the blocks it would load
back from its host tier at ``host_block_weight`` each: Dynamo's default 0.75 (llm-d's scorer
weighs them 0.8); 0 makes the policy tier-blind. A fixed discount, not a time.

``kv_cost_summed`` is the rule this policy followed before (kept one release beside it, for the
simulator's old-vs-new table): the load from the workers' reports, every request's whole blocks
summed, ``cost = w * (queued_prefill / P + blocks - overlap) + (decode + queued_prefill) / P +
blocks``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence

from .base import Decision, Policy, RoutingRequest, WorkerState, healthy, register_policy

__all__ = ["KvCost", "KvCostSummed"]


class _HostWeighted(Policy):
    """The overlap both kv_cost rules read: device blocks whole, host blocks discounted."""

    def __init__(self, seed: int | None, host_block_weight: float):
        super().__init__(seed)
        if not 0.0 <= host_block_weight <= 1.0:
            raise ValueError(f"host_block_weight must be in [0, 1], got {host_block_weight}")
        self.host_block_weight = host_block_weight

    def overlap(self, request: RoutingRequest, index) -> tuple[dict, dict]:
        """(worker -> overlap blocks, host-weighted; the index's ``match_tiers`` answer)."""
        tiers = index.match_tiers(request.block_hashes) if request.block_hashes else {}
        return {w: self.weigh(dev, both) for w, (dev, both) in tiers.items()}, tiers

    def weigh(self, device: int, both: int) -> float:
        """Blocks of overlap: the device's whole, the host tier's at ``host_block_weight``."""
        return device + self.host_block_weight * (both - device)


@register_policy("kv_cost")
class KvCost(_HostWeighted):
    def __init__(
        self,
        seed: int | None = 0,
        prefill_load_scale: float = 1.0,
        overlap_score_credit: float = 1.0,
        host_block_weight: float = 0.75,
        assume_kv_reuse: bool = True,
    ):
        super().__init__(seed, host_block_weight)
        for name, x in (("prefill_load_scale", prefill_load_scale),
                        ("overlap_score_credit", overlap_score_credit)):  # fmt: skip
            if x < 0:
                raise ValueError(f"{name} must be >= 0, got {x}")
        self.prefill_load_scale = prefill_load_scale
        self.overlap_score_credit = overlap_score_credit
        self.assume_kv_reuse = assume_kv_reuse
        self._active: dict[Hashable, Counter] = {}  # worker -> active block -> requests holding it
        self._prefill: dict[Hashable, float] = {}  # worker -> booked prefill tokens
        self._booked: dict[Hashable, tuple[Hashable, tuple, float]] = {}  # request -> booking
        self._page_size = 1  # the index's, read in choose (on_dispatch books in its tokens)

    def _blocks(self, request: RoutingRequest) -> tuple:
        if self.assume_kv_reuse:
            return tuple(request.block_hashes)
        return tuple((request.request_id, i) for i in range(len(request.block_hashes)))

    def new_blocks(self, worker_id: Hashable, blocks: Sequence) -> int:
        """The request's blocks not already active on the worker: all but its chain's prefix
        that is."""
        active = self._active.get(worker_id, ())
        shared = 0
        for b in blocks:
            if b not in active:
                break
            shared += 1
        return len(blocks) - shared

    def choose(self, request: RoutingRequest, workers: Sequence[WorkerState], index) -> Decision:
        live = healthy(workers)
        P = self._page_size = index.page_size
        overlap, tiers = self.overlap(request, index)
        blocks = self._blocks(request)
        scale, credit = self.prefill_load_scale, self.overlap_score_credit

        def cost(w: WorkerState) -> float:
            wid = w.worker_id
            prefill = (self._prefill.get(wid, 0.0) + request.num_tokens) / P
            prefill = max(0.0, prefill - credit * overlap.get(wid, 0))
            decode = len(self._active.get(wid, ())) + self.new_blocks(wid, blocks)
            return scale * prefill + decode

        best, scores = self.lowest(live, [cost(w) for w in live])
        pick = self.pick_tied(best, request.fleet)
        cached = tiers.get(pick.worker_id, (0, 0))[0] * P
        return Decision(pick.worker_id, "kv_cost: lowest cost", cached, scores, tiers=tiers)

    def on_dispatch(self, decision: Decision, request: RoutingRequest) -> None:
        self._release(request.request_id)  # a retry: the failed attempt's booking goes
        wid = decision.worker_id
        overlap = self.weigh(*(decision.tiers or {}).get(wid, (0, 0)))
        prefill = max(0.0, request.num_tokens - overlap * self._page_size)
        blocks = self._blocks(request)
        self._active.setdefault(wid, Counter()).update(blocks)
        self._prefill[wid] = self._prefill.get(wid, 0.0) + prefill
        self._booked[request.request_id] = (wid, blocks, prefill)

    def on_first_token(self, request_id: Hashable, worker_id: Hashable) -> None:
        booking = self._booked.get(request_id)
        if booking is None or booking[2] == 0:
            return
        wid, blocks, prefill = booking
        self._prefill[wid] -= prefill
        self._booked[request_id] = (wid, blocks, 0.0)

    def on_complete(self, request_id, worker_id, cached_tokens: int) -> None:
        self._release(request_id)

    def _release(self, request_id: Hashable) -> None:
        booking = self._booked.pop(request_id, None)
        if booking is None:
            return
        wid, blocks, prefill = booking
        self._prefill[wid] -= prefill
        active = self._active[wid]
        active.subtract(blocks)
        for b in blocks:
            if active[b] <= 0:
                del active[b]


@register_policy("kv_cost_summed")
class KvCostSummed(_HostWeighted):
    """kv_cost's rule before Dynamo's new-block accounting (see the module docstring)."""

    def __init__(
        self,
        seed: int | None = 0,
        overlap_score_weight: float = 1.0,
        host_block_weight: float = 0.75,
    ):
        super().__init__(seed, host_block_weight)
        if overlap_score_weight < 0:
            raise ValueError(f"overlap_score_weight must be >= 0, got {overlap_score_weight}")
        self.overlap_score_weight = overlap_score_weight

    def choose(self, request: RoutingRequest, workers: Sequence[WorkerState], index) -> Decision:
        live = healthy(workers)
        P = index.page_size
        overlap, tiers = self.overlap(request, index)
        req_blocks = -(-request.num_tokens // P)
        wgt = self.overlap_score_weight

        def cost(w: WorkerState) -> float:
            prefill = w.queued_prefill_tokens / P + (req_blocks - overlap.get(w.worker_id, 0))
            active = (w.active_decode_tokens + w.queued_prefill_tokens) / P
            return wgt * prefill + active + req_blocks

        best, scores = self.lowest(live, [cost(w) for w in live])
        pick = self.pick_tied(best, request.fleet)
        cached = tiers.get(pick.worker_id, (0, 0))[0] * P
        return Decision(pick.worker_id, "kv_cost_summed: lowest cost", cached, scores, tiers=tiers)
