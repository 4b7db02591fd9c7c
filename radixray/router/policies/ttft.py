"""ttft: ours. Each request goes where its cost is lowest: its own predicted time to first token
on that worker plus what the placement costs the requests around it, all in seconds. The formula,
a paragraph per term and a worked decision: docs/ttft_policy.md. What was tried and measured
instead: benchmarks/HISTORY.md.

Every decision names each candidate's terms (``Decision.terms``, ``TERMS`` order) and the term
that separated the winner from the runner-up (``Decision.decided_by``): ``/debug/decisions`` and
the simulator's records show them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from radixray.numbers import Ewma

from .base import (
    Decision,
    Policy,
    RoutingRequest,
    WorkerState,
    healthy,
    register_policy,
    separating_term,
)
from .demand import PrefixDemand
from .headroom import Headroom
from .ttft_config import TTFTConfig

__all__ = ["TERMS", "PredictedTTFT"]

TERMS = ("wait", "prefill", "load", "recompute", "evict", "decode")  # seconds, in this order
# The busy-worker estimate of utilisation is capped here (its reuse weight at 4): past it a
# worker with one decoding request reads as busy, and the weight held requests on their prefix
# behind long queues (docs/ttft_policy.md, "Recompute").
RHO_MAX = 0.8


@dataclass(slots=True)
class _Inputs:
    """What one request sets for every worker's cost: its tokens, the longest prefix any worker
    holds (``c_best``) and the one a share of them hold (``c_shared``), the reuse weight ``L``,
    the reuse share, the evicted-and-asked-again rate, the weight of the copy a move leaves
    stale, the workers outside a saturated fleet's queue, and the tokens its answer decodes."""

    n: int
    page_size: int
    c_best: int
    c_shared: int
    weight: float
    reuse: float
    evicted: float
    stale: float
    outside: frozenset
    answer: float


@register_policy("ttft")
class PredictedTTFT(Policy):
    settings_class = TTFTConfig

    def __init__(self, seed: int | None = 0, config: TTFTConfig | None = None, **settings):
        """``config``, or its fields by name (``make_policy("ttft:margin=0.1")``)."""
        super().__init__(seed)
        self.config = c = config or TTFTConfig(**settings)
        self._rho = Ewma(1.0 / c.memory, initial=0.0)  # the busy share of workers at arrivals
        self.capacity = Headroom(c.memory)  # offered prefill work against the fleet's capacity
        self._reuse = Ewma(1.0 / c.memory, initial=0.0)  # the share of a prompt found cached
        self.demand = PrefixDemand() if c.margin else None

    @property
    def rho(self) -> float:  # the busy share of workers arrivals see
        return self._rho.value

    @property
    def headroom(self) -> float:
        """``1 - rho`` of the offered work (``<= 0``: saturated): the decision record and
        ``/metrics`` show it."""
        return self.capacity.headroom

    @property
    def reuse(self) -> float:
        return self._reuse.value

    def _weight(self, live: Sequence[WorkerState]) -> tuple[float, frozenset]:
        """``L``, the requests a second of recomputed prefill delays, from the load measured
        before this arrival (the larger of the busy-worker and the offered-work estimates), and
        the workers outside a saturated fleet's queue (their mean queue under the fleet's)."""
        n = len(live)
        rho = min(self._rho.update(sum(1 for w in live if w.running or w.waiting) / n), RHO_MAX)
        if self.config.reuse_weight is not None:  # fixed: no estimate of the fleet's load
            return self.config.reuse_weight, frozenset()
        own = self.capacity.waiting_all([(w.worker_id, w.waiting) for w in live], n)
        self.capacity.forget(own.keys())
        outside = frozenset()
        if self.capacity.saturated:
            mean = sum(own.values()) / n
            outside = frozenset(k for k, v in own.items() if v < mean)
        return max(rho / (1.0 - rho), self.capacity.reuse_weight), outside

    def choose(self, request: RoutingRequest, workers: Sequence[WorkerState], index) -> Decision:
        live = healthy(workers)
        weight, outside = self._weight(live)
        config, P, n = self.config, index.page_size, request.num_tokens
        found = tiers = index.match_tiers(request.block_hashes) if request.block_hashes else {}
        if not config.tiers:  # tier-blind: what index.match sees
            tiers = {w: (dev, dev) for w, (dev, _) in tiers.items() if dev}
        # c_w: the prefix w can reuse, on its device or loaded back from its host tier (what
        # only an unhealthy worker holds is no one's to reuse)
        ids, cap = {w.worker_id for w in live}, max(n - 1, 0)
        reusable = {w: min(both * P, cap) for w, (_, both) in tiers.items() if w in ids}
        longest = max(reusable.values(), default=0)
        key = self._observe_demand(request, tiers)
        reuse = self._reuse.update(longest / n) if n else self._reuse.value
        # a match under min_match of the prompt is inside the cost model's error: none
        floor = config.min_match * n
        least, c_shared = max(floor, 1), 0
        if reusable:
            cached = {w.worker_id: _held(w, c, tiers, P) if (c := reusable.get(w.worker_id, 0))
                      >= least else (0, 0) for w in live}  # fmt: skip
            depths = sorted((c for c, _ in cached.values()), reverse=True)
            if len(depths) > 1:
                c_shared = depths[max(1, int(len(depths) * config.shared_share))]
        else:
            cached = {w.worker_id: (0, 0) for w in live}
        evicted = _evicted_rate(workers, index, reuse)
        # a move leaves the holder's copy stale: once caches are full it takes room a cached
        # token would have, reused at the reuse share
        total = sum(w.total_pages for w in live)
        full = 1.0 - sum(w.free_pages for w in live if w.total_pages) / total if total else 0.0
        inputs = _Inputs(
            n, P, longest if longest >= floor else 0, c_shared, weight, reuse, evicted,
            reuse * full, outside, _answer_tokens(live),
        )  # fmt: skip
        terms = {w.worker_id: self._terms(w, cached[w.worker_id], inputs) for w in live}
        best, scores = self.lowest(live, [sum(terms[w.worker_id]) for w in live])
        if c_shared and len(best) > 1:  # a tie the shared prefix made: to those that hold most
            most = max(cached[w.worker_id][0] for w in best)
            best = [w for w in best if cached[w.worker_id][0] == most]
        pick = self.pick_tied(best, request.fleet, request.cache_key)
        pick, kept = self._keep(pick, live, cached, inputs.c_best, scores, key)
        c = reusable.get(pick.worker_id, 0)
        self._observe_work(request, pick, n - _held(pick, c, tiers, P)[0], len(live))
        decided = "margin" if kept else separating_term(pick.worker_id, scores, terms, TERMS)
        best_match = inputs.c_best and c == inputs.c_best
        reason = kept or ("ttft: best match" if best_match else "ttft: lowest cost")
        return Decision(pick.worker_id, reason, c, scores, headroom=self.headroom, tiers=found,
                        terms=terms, term_names=TERMS, decided_by=decided)  # fmt: skip

    def _terms(self, w: WorkerState, held: tuple[int, int], p: _Inputs) -> tuple:
        """The ``TERMS`` of placing the request on ``w``, which reuses ``held`` = ``(c, d)``
        tokens (``d`` of them on its device)."""
        (c, d), n, P = held, p.n, p.page_size
        # cached tokens the placement evicts (its new pages beyond the free ones); with a host
        # tier demoted there as far as it has room (worth their load-back), the rest lost
        spill = max(0, n - d - w.free_pages * P) if w.total_pages else 0
        demoted = spill if self.config.tiers and w.load_tokens_per_s > 0 else 0
        if demoted and w.host_total_pages:
            demoted = min(demoted, w.host_free_pages * P)
        spill -= demoted
        # an idle worker, or one outside a saturated fleet's queue, counts the shared prefix
        shares = not (w.running or w.waiting) or w.worker_id in p.outside
        cc = max(c, p.c_shared) if shares else c
        # one step's fixed cost whatever the queue (by its steps, a burst across routers herded)
        rate, token_s = w.prefill_tokens_per_s, 1.0 / w.prefill_tokens_per_s
        own = w.prefill_overhead_s + (n - cc) / rate + (w.decode_step_s if w.running else 0.0)
        return (
            w.queued_prefill_tokens / rate,  # wait: the prefill queued ahead
            own,  # prefill: its own uncached tokens
            w.load_time(c - d) if c > d else 0.0,  # load: what it loads back from the host tier
            (p.weight + p.stale) * (p.c_best - cc) * token_s,  # recompute: held elsewhere
            p.evicted * spill * token_s + p.reuse * (w.load_time(demoted) if demoted else 0.0),
            _decode_cost(w, p.answer) if p.answer else 0.0,  # decode: for those already there
        )

    def _observe_work(self, request, pick: WorkerState, uncached: int, workers: int) -> None:
        """The prefill work this placement brings the fleet (``Headroom``); in a fleet of
        routers this one sees about 1 / routers of the arrivals."""
        fit = pick.prefill_overhead_s + uncached / pick.prefill_tokens_per_s
        work = fit if uncached > 0 else 0.0
        self.capacity.observe(request.arrival_time, work * max(1, request.fleet[1]), workers)

    def _keep(self, pick: WorkerState, live, cached: dict, c_best: int, scores: dict, key):
        """``(worker, reason)``: the cheapest holder of the longest prefix and the margin's
        reason if ``pick`` holds less and saves no more than ``margin`` of that holder's cost,
        unless the prefix (``key``) is asked for more often than its holders serve (a copy
        pays); else ``(pick, None)``."""
        margin = self.config.margin
        if not margin or not c_best or cached[pick.worker_id][0] >= c_best:
            return pick, None
        holders = [w for w in live if cached[w.worker_id][0] >= c_best]
        if self.demand.under_replicated(key, len(holders), len(live)):
            return pick, None
        holder = min(holders, key=lambda w: scores[w.worker_id])
        if scores[pick.worker_id] > (1 - margin) * scores[holder.worker_id]:
            return holder, "ttft: within the margin"
        return pick, None

    def _observe_demand(self, request: RoutingRequest, tiers: dict):
        """The prefix a move would copy, keyed by the deepest block of the prompt any worker
        holds (either tier), fed to ``PrefixDemand``; None with the margin off or none held."""
        if self.demand is None:
            return None
        deepest = max((both for _, both in tiers.values()), default=0)
        key = request.block_hashes[deepest - 1] if deepest else None
        self.demand.observe(key)
        return key

    def __repr__(self) -> str:
        return f"PredictedTTFT({self.config}, rho={self.rho:.3f}, headroom={self.headroom:.3f})"


def _held(w: WorkerState, c: int, tiers: dict, page_size: int) -> tuple[int, int]:
    """(c_w, d_w): of the ``c`` tokens ``w`` could reuse, those it reuses and those of them on
    its device; a worker without a measured host tier recomputes what only its host holds."""
    if not c:
        return 0, 0
    d = min(tiers[w.worker_id][0] * page_size, c)
    return (c, d) if w.load_tokens_per_s > 0 else (d, d)


def _evicted_rate(workers: Sequence[WorkerState], index, reuse: float) -> float:
    """The share of the tokens a placement evicts that a later request asks for and finds
    nowhere (``LostBlocks``, over a horizon of the fleet's pages in both tiers; the reuse share
    until losses are seen)."""
    if pages := sum(w.total_pages + w.host_total_pages for w in workers):
        index.lost.resize(pages)
    return index.lost.rate(reuse)


def _answer_tokens(live: Sequence[WorkerState]) -> float:
    """The tokens a request is expected to decode: the mean the workers report (0 before any
    sequence ended)."""
    known = [w.answer_tokens for w in live if w.answer_tokens > 0]
    return sum(known) / len(known) if known else 0.0


def _decode_cost(w: WorkerState, answer: float) -> float:
    """Seconds an answer of ``answer`` tokens adds on ``w`` to the requests already there: each
    of its steps is ``decode_seq_s`` longer for a waiting request and, overlapped, about half
    that for a running one; while ``w``'s steps are full of queued prefill each answer token
    also takes a budget token from it, a prefill token's time for everyone waiting."""
    if not answer:
        return 0.0
    per_token = w.decode_seq_s * (w.running / 2 + w.waiting)
    if w.max_batch_tokens and w.queued_prefill_tokens >= w.max_batch_tokens - w.running:
        per_token += max(w.waiting, 1) / w.prefill_tokens_per_s
    return answer * per_token
