"""ttft: ours. Send each request where its predicted time to first token, plus the delay its
recomputation imposes on everyone else, is lowest.

For each healthy worker ``w``, with ``c_w`` the tokens of this request cached there (index match,
page-aligned, at most ``n - 1``: the last prompt token is always computed) and ``R_w``, ``O_w``
the prefill rate and step overhead measured by the worker (pooled over the workers of its
performance class, so identical workers are compared on load and cache, not on fit noise)::

    ttft_w  = O_w + (queued_prefill_tokens_w + n - c_w) / R_w  +  decode_step_s_w   [if decoding]
    reuse_w = (c_best - c_w) / R_w                      c_best = max over workers of c_w
    evict_w = h * max(0, n - c_w - free_tokens_w) / R_w  h = share of prompts found cached
    cost_w  = ttft_w + L * reuse_w + evict_w            L = rho / (1 - rho)

``O_w + x / R_w`` is the measured fit of a prefill step's time against its size (fixed cost
``O_w``, marginal rate ``R_w``; a plain tokens/time ratio would make a worker that happened to
get long prompts look faster and attract more of them). The router fits it over all workers of
one performance class together, so identical workers get the same cost curve and differ only in
what they hold and what they are doing. The fit's prediction is what is compared, not its two
parameters apart: near the step sizes a worker has seen it is accurate even when the slope alone
is noisy. ``ttft_w`` is what the request itself waits: the prefill work queued ahead of it, its
own uncached tokens, and the decode step in flight (the class's average decode interference
during prefill chunks is inside the fit; the worker's own decode batch shows in
``decode_step_s``).

``reuse_w`` is what a myopic TTFT rule leaves out. Recomputing a prefix that another worker holds
does not only cost this request: the duplicate work occupies a worker that the requests arriving
after it then queue behind, and the duplicate copy takes cache room that evicts other prefixes
(so later requests miss). Both grow with how busy the cluster is. We charge the duplicated
compute once more for each request it is expected to delay: in an M/M/1 queue at utilisation
``rho`` there are on average ``L = rho / (1 - rho)`` requests in the system. ``rho`` is measured,
not set: by PASTA (Poisson arrivals see time averages) the fraction of workers that are busy when
requests arrive estimates the utilisation; the policy keeps an EWMA of it over ~64 arrivals.
Idle cluster: ``L ~ 0``, pure predicted TTFT (spread load, recompute freely). Saturated cluster:
``L`` large, recomputation is avoided unless a queue is long enough to be worth it. There are no
hand-set thresholds; ``rho`` is clipped at ``rho_max`` only to keep ``L`` finite.

``evict_w`` prices the cache room a placement takes: the new pages beyond a worker's free ones
evict cached tokens, and each evicted token is recomputed later with the probability that a
cached token is reused, estimated by ``h``, the EWMA share of arriving prompt tokens found cached
on some worker. Without it, a cold request on an idle cluster goes to whichever worker measures
fastest, load concentrates, and one cache churns while the others sit empty.

Lowest cost wins; exact ties are broken at random (seeded), or, in a fleet of routers, by this
router's rank (``Policy.pick_tied``). Cost: one index match and O(workers) arithmetic per
request.
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import Decision, Policy, RoutingRequest, WorkerState, healthy, register_policy

__all__ = ["PredictedTTFT"]


@register_policy("ttft")
class PredictedTTFT(Policy):
    def __init__(
        self,
        seed: int | None = 0,
        reuse_weight: float | None = None,
        ewma_requests: int = 64,
        rho_max: float = 0.95,
    ):
        """``reuse_weight`` fixes ``L`` (None: measured, the default; 0: myopic TTFT);
        ``ewma_requests`` is the memory of the utilisation estimate, in arrivals."""
        super().__init__(seed)
        if reuse_weight is not None and reuse_weight < 0:
            raise ValueError(f"reuse_weight must be >= 0 or None, got {reuse_weight}")
        if ewma_requests < 1:
            raise ValueError(f"ewma_requests must be >= 1, got {ewma_requests}")
        if not 0 < rho_max < 1:
            raise ValueError(f"rho_max must be in (0, 1), got {rho_max}")
        self.reuse_weight = reuse_weight
        self._decay = 1.0 - 1.0 / ewma_requests
        self.rho_max = rho_max
        self.rho = 0.0  # EWMA of the busy fraction seen at arrivals
        self.reuse = 0.0  # EWMA of the share of arriving prompts found cached somewhere

    def _observe(self, live: Sequence[WorkerState]) -> float:
        busy = 0
        for w in live:
            if w.running or w.waiting:
                busy += 1
        self.rho = self._decay * self.rho + (1.0 - self._decay) * busy / len(live)
        rho = min(self.rho, self.rho_max)
        return rho / (1.0 - rho)

    def choose(self, request: RoutingRequest, workers: Sequence[WorkerState], index) -> Decision:
        live = healthy(workers)
        weight = self._observe(live)
        if self.reuse_weight is not None:
            weight = self.reuse_weight
        P = index.page_size
        matched = index.match(request.block_hashes) if request.block_hashes else {}
        n = request.num_tokens
        cap = max(n - 1, 0)
        c_best = min(max(matched.values(), default=0) * P, cap)
        if n:
            self.reuse = self._decay * self.reuse + (1.0 - self._decay) * c_best / n
        reuse = self.reuse

        def cost(w: WorkerState) -> float:
            c = min(matched.get(w.worker_id, 0) * P, cap)
            # Cached tokens this placement would evict (its new pages beyond the free ones),
            # each worth a recompute with the probability that a cached token is reused.
            spill = max(0, n - c - w.free_pages * P) if w.total_pages else 0
            work = w.queued_prefill_tokens + n - c + weight * (c_best - c) + reuse * spill
            t = w.prefill_overhead_s + work / w.prefill_tokens_per_s
            return t + w.decode_step_s if w.running else t

        best, scores = self.lowest(live, cost)
        pick = self.pick_tied(best)
        c = min(matched.get(pick.worker_id, 0) * P, cap)
        reason = "ttft: best match" if c == c_best and c else "ttft: lowest cost"
        return Decision(pick.worker_id, reason, c, scores)

    def __repr__(self) -> str:
        return f"PredictedTTFT(reuse_weight={self.reuse_weight}, rho={self.rho:.3f})"
