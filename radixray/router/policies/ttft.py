"""ttft: ours. Send each request where its predicted time to first token, plus the delay its
recomputation imposes on everyone else, is lowest::

    cost_w = O_w + (queued_w + n - c_w + (L_w + h * f) * (c_best - c_w) + e * spill_w) / R_w
             + load_w(c_w - d_w) + h * load_w(demoted_w)  (+ decode_step_s_w while it decodes)
             + A * (s_w * (running_w / 2 + waiting_w) + [full steps] max(waiting_w, 1) * token_w)

(with ``steps``, off by default: the queue and the prompt by ``w``'s engine steps, ``ceil((queued_w
+ n - c_w) / (B_w - running_w))`` steps of its step budget less its decodes, each at the larger of
``O_w`` and its decode step, and the other tokens at a token's share of a full step;
``step_cost.prefill_seconds``, docs/ttft_policy.md, "Queue time in steps")

(``c_w`` tokens reusable on ``w``, none if under ``min_match`` of the prompt, ``d_w`` of them on its
device pool and the rest on its host tier, loaded back at its measured ``load_w``; on an idle worker
at least the prefix a quarter of the workers hold, as on a worker whose mean queue is under the
fleet's while the fleet is saturated; ``R_w`` / ``O_w`` its pooled prefill fit; ``queued_w`` its
queued prefill (with ``lpm``, off by default: only what the scheduler would run before this request,
``Waiting``); ``L_w`` the larger of ``rho / (1 - rho)`` by the share of busy workers (``rho <=
0.8``) and by the fleet's offered work over its capacity (``Headroom``: uncapped as the headroom
closes), the latter scaled by ``w``'s share of the fleet's mean queue (a worker whose queue stays
empty is outside it); ``h`` the measured reuse share, ``f`` the share of the fleet's pages in use
(the copy a move leaves stale costs cache room once caches are full), ``spill_w`` the cached tokens
the placement would evict, lost without a host tier, each worth a recompute with ``e`` the measured
share of lost blocks requested again (``LostBlocks``; ``h`` until losses are seen), ``demoted_w``
with one: worth their load-back, not their recompute, only as far as its host tier has room
(``host_room``), the rest stay in ``spill_w``; ``A`` the tokens a sequence decodes and ``s_w`` the
seconds one more decoding sequence adds to a step of ``w``'s, as the workers measure them: the steps
this request's answer adds for those already there, plus, while ``w``'s steps are full of prefill,
the budget tokens it takes from the requests waiting there, ``decode_cost``). Why each term is
there, and what was tried instead: docs/ttft_policy.md. Lowest cost wins; ties: seeded random, or by
rank in a fleet of routers. A win off the longest prefix's holders stands only if it saves more
than ``margin`` of the cheapest holder's cost, unless the prefix is asked for more often than its
holders serve (``PrefixDemand``: then a copy pays).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from radixray.numbers import Ewma

from .base import Decision, Policy, RoutingRequest, WorkerState, healthy, register_policy
from .costs_to_others import answer_tokens, decode_cost, packing_delay, pages_in_use
from .demand import PrefixDemand
from .headroom import Headroom
from .tail import IdealTail
from .waiting import Waiting

__all__ = ["PredictedTTFT"]


@dataclass(slots=True)
class _Price:
    """The terms of ``cost_w`` one request sets for every worker (the module's docstring):
    ``stale``, what a token of the copy a move leaves stale costs beside ``L_w`` (the reuse
    share, or with ``lost_stale`` the evicted rate, times the share of the fleet's pages in use;
    0 without ``stale``); ``answer``, the tokens its answer decodes (0 without ``decode``);
    ``limit``, the TTFT tail (``tail``)."""

    n: int
    page_size: int
    c_best: int
    c_shared: int
    reuse: float
    evicted: float
    stale: float
    outside: frozenset
    answer: float
    limit: float | None


@register_policy("ttft")
class PredictedTTFT(Policy):
    def __init__(
        self,
        seed: int | None = 0,
        reuse_weight: float | None = None,
        ewma_requests: int = 64,
        rho_max: float = 0.8,
        min_match: float = 0.01,
        headroom: bool = True,
        tiers: bool = True,
        stale: bool = True,
        shared: bool = True,
        shared_share: float = 0.25,
        lpm: bool = False,
        host_room: bool = True,
        steps: bool = False,
        work_steps: bool = False,
        decode: bool = True,
        spare: bool = True,
        replicate: bool = True,
        lost: bool = True,
        lost_stale: bool = False,
        tail: float = 0.0,
        margin: float = 0.2,
        demand: bool = True,
        packing: bool = False,
    ):
        """Each option names a rule; False (or the value named) restores the rule before it,
        for comparison, and docs/ttft_policy.md says why each is there. ``reuse_weight`` fixes
        ``L`` (None: measured; 0: myopic TTFT); ``ewma_requests``: the memory of the utilisation
        estimates, in arrivals; ``rho_max`` caps the busy-worker estimate (``L <= 4``);
        ``headroom``: ``L`` at least the fleet's offered work over its capacity's ``rho / (1 -
        rho)`` (``Headroom``); a prefix under ``min_match`` of the prompt counts as none;
        ``tiers=False``: the tier-blind baseline (host-tier copies invisible); ``stale``: a
        move off a prefix's holders is charged the copy it leaves stale; ``shared``: an idle
        worker counts the prefix more than ``shared_share`` of the workers (at least two) hold
        as held ("Copies of a prefix"); ``decode``: the steps this request's answer adds for
        those already on a worker ("Decode cost"); ``spare``: the headroom's weight on a worker
        scaled by its share of the fleet's mean queue (``Headroom.waiting_all``); ``replicate``:
        while the fleet is saturated, a worker whose mean queue is under the fleet's counts the
        prefix as an idle one does ("A worker outside the queue"); ``lost``: an evicted token
        is priced at the measured rate lost blocks are asked for again, not ``h`` ("Eviction's
        price"); ``host_room``: demotions priced at their load-back only up to the host tier's
        room, the rest as lost ("Host tiers"); ``margin`` (0: off), a move off a prefix's holder
        only when it saves more than that share of the holder's cost, with ``demand`` only for
        a prefix asked for no more often than its holders serve (``PrefixDemand``; "A margin
        that knows a copy's return"). Measured, not adopted (off): ``lpm``, only the queued work
        the scheduler admits first (``Waiting``); ``steps``, queued and own prefill by the
        engine steps they take; ``lost_stale``, the stale copy priced at the lost-block rate too
        ("Eviction's price"); ``work_steps``, the headroom's work by steps ("Queue time in
        steps"); ``tail`` (0: off), a request's predicted seconds to first token past the TTFT
        tail its workload sets by itself (``IdealTail``) counted ``1 + tail`` times ("The tail
        guard"); ``packing``, the wait its first chunk adds to the request whose prefill ends in
        the same step (``packing_delay``; "A chunk packed into another's last step")."""
        super().__init__(seed)
        _check(reuse_weight, ewma_requests, rho_max, min_match, shared_share, margin, tail)
        self.reuse_weight, self.rho_max, self.min_match = reuse_weight, rho_max, min_match
        self.use_headroom, self.tiers, self.stale = headroom, tiers, stale
        self.shared, self.shared_share = shared, shared_share
        self.waiting = Waiting() if lpm else None
        self.host_room, self.steps, self.work_steps = host_room, steps, work_steps
        self.decode, self.spare, self.replicate = decode, spare, replicate
        self.lost, self.lost_stale, self.tail = lost, lost_stale, tail
        self.ideal = IdealTail() if tail else None
        self.margin = margin
        self.demand = PrefixDemand() if margin and demand else None
        self.packing = packing
        # Averages over ~ewma_requests arrivals: the busy fraction of the workers an arrival
        # sees, the fleet's offered prefill work against its capacity, the share of a prompt
        # found cached on some worker.
        self._rho = Ewma(1.0 / ewma_requests, initial=0.0)
        self.capacity = Headroom(ewma_requests)
        self._reuse = Ewma(1.0 / ewma_requests, initial=0.0)

    @property
    def rho(self) -> float:
        """The busy fraction of the workers arrivals see (an upper bound on utilisation)."""
        return self._rho.value

    @property
    def headroom(self) -> float:
        """The fleet's spare prefill capacity, ``1 - `` offered work over capacity (``<= 0``:
        saturated): what the decision record and ``/metrics`` show."""
        return self.capacity.headroom

    @property
    def reuse(self) -> float:
        return self._reuse.value

    def _weights(self, live: Sequence[WorkerState]) -> tuple[list[float], frozenset]:
        """``(L, outside)`` from the utilisation measured before this arrival: ``L``, the reuse
        weight on each worker of ``live`` (in its order), the larger of the capped busy-worker
        rule and the uncapped offered-work rule, the latter (with ``spare``) scaled by the
        worker's share of the fleet's mean queue; ``outside`` (with ``replicate``), the workers
        whose mean queue is under the fleet's while the fleet is saturated."""
        n = len(live)
        busy = sum(1 for w in live if w.running or w.waiting)
        rho = min(self._rho.update(busy / n), self.rho_max)
        none: frozenset = frozenset()
        if self.reuse_weight is not None:
            return [self.reuse_weight] * n, none
        weight = rho / (1.0 - rho)
        if not self.use_headroom:
            return [weight] * n, none
        fleet = max(weight, self.capacity.reuse_weight)
        if not (self.spare or self.replicate):
            return [fleet] * n, none
        # each worker's mean queue, and the fleet's
        capacity = self.capacity
        own = capacity.waiting_all([(w.worker_id, w.waiting) for w in live], n)
        capacity.forget(own.keys())
        mean = sum(own.values()) / n
        outside = none
        if self.replicate and capacity.saturated:
            outside = frozenset(k for k, v in own.items() if v < mean)
        if not self.spare or mean <= 0:
            return [fleet] * n, outside
        return [max(weight, fleet * min(1.0, own[w.worker_id] / mean)) for w in live], outside

    def choose(self, request: RoutingRequest, workers: Sequence[WorkerState], index) -> Decision:
        live = healthy(workers)
        weights, outside = self._weights(live)
        P = index.page_size
        found = tiers = index.match_tiers(request.block_hashes) if request.block_hashes else {}
        if not self.tiers:  # tier-blind: what index.match sees
            tiers = {w: (dev, dev) for w, (dev, _) in tiers.items() if dev}
        n = request.num_tokens
        cap = max(n - 1, 0)
        # c_w: the prefix w can reuse, on its device pool or loaded back from its host tier
        # (d_w of it on the device); a worker without a host tier has d_w = c_w. What only an
        # unhealthy worker (or one the index still lists) holds is no one's to reuse.
        ids = {w.worker_id for w in live}
        reusable = {w: min(both * P, cap) for w, (_, both) in tiers.items() if w in ids}
        longest = max(reusable.values(), default=0)
        key = self._observe_demand(request, tiers)
        reuse = self._reuse.update(longest / n) if n else self._reuse.value
        evicted = self._evicted_rate(workers, index, reuse)
        # Matches that save under min_match of the prompt's prefill count as none: inside the
        # cost model's error; a header all prompts share would draw them to its first holder.
        floor = self.min_match * n
        c_best = longest if longest >= floor else 0
        # (c_w, d_w) of each live worker, none when its prefix (both tiers) is under the floor
        least = max(floor, 1)
        cached = {
            w.worker_id: _held(w, reusable, tiers, P)
            if reusable.get(w.worker_id, 0) >= least
            else (0, 0)
            for w in live
        }
        # A prefix a share of the workers hold (at least two) counts as held on an idle worker or
        # one outside a saturated fleet's queue: it computes it once and holds it from then on.
        depths = sorted((c for c, _ in cached.values()), reverse=True) if self.shared else [0]
        c_shared = depths[max(1, int(len(depths) * self.shared_share))] if len(depths) > 1 else 0
        full = pages_in_use(live) if self.stale else 0.0
        price = _Price(
            n=n,
            page_size=P,
            c_best=c_best,
            c_shared=c_shared,
            reuse=reuse,
            evicted=evicted,
            stale=(evicted if self.lost_stale else reuse) * full,
            outside=outside,
            # what this request's answer adds to the steps of those already on w (decode_cost)
            answer=answer_tokens(live) if self.decode else 0.0,
            limit=self._tail_limit(live, n - longest),
        )
        costs = [
            self._cost(w, cached[w.worker_id], L, price) for w, L in zip(live, weights, strict=True)
        ]
        best, scores = self.lowest(live, costs)
        if c_shared and len(best) > 1:  # a tie the shared prefix made: to those that hold most
            most = max(cached[w.worker_id][0] for w in best)
            best = [w for w in best if cached[w.worker_id][0] == most]
        pick = self.pick_tied(best, request.fleet, request.cache_key)
        pick, reason = self._keep(pick, live, cached, c_best, scores, key)
        c = reusable.get(pick.worker_id, 0)
        self._observe_work(request, pick, n - _held(pick, reusable, tiers, P)[0], len(live))
        reason = reason or ("ttft: best match" if c_best and c == c_best else "ttft: lowest cost")
        return Decision(pick.worker_id, reason, c, scores, headroom=self.headroom, tiers=found)

    def _cost(self, w: WorkerState, held: tuple[int, int], weight: float, p: _Price) -> float:
        """``cost_w`` (the module's docstring) of a worker that reuses ``held`` = ``(c, d)``
        tokens, ``d`` of them on its device, at reuse weight ``weight``, with the request's
        terms ``p``."""
        (c, d), n, P = held, p.n, p.page_size
        # Cached tokens this placement would evict (its new pages beyond the free ones, the
        # loaded-back ones included), each worth a recompute with the probability that a
        # cached token is reused; with a host tier demoted, worth their load-back (with
        # host_room only as far as it has room: the rest push as many out of it, lost).
        spill = max(0, n - d - w.free_pages * P) if w.total_pages else 0
        demoted = spill if self.tiers and w.load_tokens_per_s > 0 else 0
        if demoted and self.host_room and w.host_total_pages:
            demoted = min(demoted, w.host_free_pages * P)
        spill -= demoted
        shares = not (w.running or w.waiting) or w.worker_id in p.outside
        cc = max(c, p.c_shared) if shares else c
        dup = (weight + p.stale) * (p.c_best - cc)
        queued = self.waiting.ahead(w, c) if self.waiting else w.queued_prefill_tokens
        # the queue and this prompt by the worker's steps (step_cost.prefill_seconds)
        t = w.prefill_s(queued, n - cc, steps=self.steps)
        if p.limit is not None:  # its seconds past the workload's own tail, once more each
            t += self.tail * max(0.0, t - p.limit)
        # and what it recomputes for others (or evicts) at a prefill token's cost there
        t += (dup + p.evicted * spill) * w.token_s(self.steps) + w.load_time(c - d)
        t += p.reuse * w.load_time(demoted) + decode_cost(w, p.answer, self.steps)
        return t + (packing_delay(w, queued, n - cc) if self.packing else 0.0)

    def _observe_work(self, request, pick: WorkerState, uncached: int, workers: int) -> None:
        """The prefill work this placement brings the fleet (``Headroom``), by the fit it was
        priced with (what it loads back from a host tier is not prefill): one step's fixed cost
        and the ``uncached`` tokens at the fit's rate, or with work_steps their share of full
        steps (each step's fixed cost over the prefill tokens a step holds). In a fleet of
        routers sharing the workers this one sees about 1 / routers of the arrivals."""
        work = pick.prefill_s(0, uncached, whole=False, steps=self.work_steps)
        routers = max(1, request.fleet[1])
        self.capacity.observe(request.arrival_time, work * routers, workers)

    def _keep(self, pick: WorkerState, live, cached: dict, c_best: int, scores: dict, key):
        """``(worker, reason)``: with ``margin``, the cheapest holder of the longest prefix and
        the margin's reason if ``pick`` holds less and saves no more than ``margin`` of that
        holder's cost (a move off a prefix's holder must save more than the cost model's
        error), else ``pick`` and None; with ``demand``, ``pick`` too while the prefix (``key``,
        its deepest block) is asked for more often than its holders serve: a copy pays."""
        if not self.margin or not c_best or cached[pick.worker_id][0] >= c_best:
            return pick, None
        holders = [w for w in live if cached[w.worker_id][0] >= c_best]
        if self.demand is not None and self.demand.under_replicated(key, len(holders), len(live)):
            return pick, None
        holder = min(holders, key=lambda w: scores[w.worker_id])
        if scores[pick.worker_id] > (1 - self.margin) * scores[holder.worker_id]:
            return holder, "ttft: within the margin"
        return pick, None

    def _observe_demand(self, request: RoutingRequest, tiers: dict):
        """With the margin's ``demand``: the prefix a move would copy, keyed by the deepest block
        of the prompt any worker holds (either tier), fed to ``PrefixDemand``; None with it off
        or nothing held."""
        if self.demand is None:
            return None
        deepest = max((both for _, both in tiers.values()), default=0)
        key = request.block_hashes[deepest - 1] if deepest else None
        self.demand.observe(key)
        return key

    def _tail_limit(self, live, ideal_tokens: int) -> float | None:
        """With ``tail``: the TTFT tail the workload sets by itself (``IdealTail``), fed this
        request's ideal TTFT first, ``ideal_tokens`` prefilled with nothing queued on the worker
        that would compute them soonest (an idle one if any: a decoding one adds its decode
        step); None with ``tail`` off or before the tail is known."""
        if self.ideal is None:
            return None
        self.ideal.observe(min(w.prefill_s(0, ideal_tokens, steps=False) for w in live))
        return self.ideal.value

    def _evicted_rate(self, workers: Sequence[WorkerState], index, reuse: float) -> float:
        """The share of the tokens a placement evicts that a later request will need and find
        nowhere (``LostBlocks``: measured over a horizon of the fleet's pages, both tiers);
        with ``lost`` False, the reuse share."""
        if not self.lost:
            return reuse
        lost = index.lost
        pages = sum(w.total_pages + w.host_total_pages for w in workers)
        if pages:
            lost.resize(pages)
        return lost.rate(reuse)

    def on_dispatch(self, decision: Decision, request: RoutingRequest) -> None:
        if self.waiting is not None:
            tokens, cached = request.num_tokens, decision.predicted_cached_tokens
            self.waiting.placed(decision.worker_id, request.request_id, tokens, cached)

    def on_complete(self, request_id, worker_id, cached_tokens: int) -> None:
        if self.waiting is not None:
            self.waiting.finished(worker_id, request_id)

    def __repr__(self) -> str:
        return (
            f"PredictedTTFT(reuse_weight={self.reuse_weight}, rho={self.rho:.3f}, "
            f"headroom={self.headroom:.3f}, "
            f"min_match={self.min_match})"
        )


def _held(w: WorkerState, reusable: dict, tiers: dict, page_size: int) -> tuple[int, int]:
    """(c_w, d_w): the tokens ``w`` reuses (``reusable``) and those of them on its device
    (``tiers``, ``match_tiers``' answer); a worker without a measured host tier recomputes what
    only its host holds."""
    c = reusable.get(w.worker_id, 0)
    if not c:
        return 0, 0
    d = min(tiers[w.worker_id][0] * page_size, c)
    return (c, d) if w.load_tokens_per_s > 0 else (d, d)


def _check(reuse_weight, ewma_requests, rho_max, min_match, shared_share, margin, tail) -> None:
    """ValueError naming the first setting out of its range."""
    if reuse_weight is not None and reuse_weight < 0:
        raise ValueError(f"reuse_weight must be >= 0 or None, got {reuse_weight}")
    if ewma_requests < 2:
        raise ValueError(f"ewma_requests must be >= 2, got {ewma_requests}")
    if not 0 < rho_max < 1:
        raise ValueError(f"rho_max must be in (0, 1), got {rho_max}")
    if not 0 <= min_match < 1:
        raise ValueError(f"min_match must be in [0, 1), got {min_match}")
    if tail < 0:
        raise ValueError(f"tail must be >= 0, got {tail}")
    if not 0 <= margin < 1:
        raise ValueError(f"margin must be in [0, 1), got {margin}")
    if not 0 < shared_share < 1:
        raise ValueError(f"shared_share must be in (0, 1), got {shared_share}")
