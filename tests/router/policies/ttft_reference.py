"""ttft's ``choose`` as written before its hot path was cut (commit ca89399), kept verbatim as
the readable reference: ``test_ttft_equality.py`` runs it beside ``PredictedTTFT`` on random
fleets and requests and asserts every decision equal, field for field. Only ``choose`` and the
helpers it read changed; the policy's state (estimates, demand, headroom) is the same code."""

from __future__ import annotations

from collections.abc import Sequence

from radixray.router.policies.base import Decision, RoutingRequest, WorkerState, healthy
from radixray.router.policies.ttft import RHO_MAX, TERMS, PredictedTTFT, _Inputs

__all__ = ["ReferenceTTFT"]


class ReferenceTTFT(PredictedTTFT):
    def _weight(self, live: Sequence[WorkerState]) -> tuple[float, frozenset]:
        n = len(live)
        rho = min(self._rho.update(sum(1 for w in live if w.running or w.waiting) / n), RHO_MAX)
        if self.config.reuse_weight is not None:
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
        P, n = index.page_size, request.num_tokens
        found = tiers = index.match_tiers(request.block_hashes) if request.block_hashes else {}
        if not self.config.tiers:
            tiers = {w: (dev, dev) for w, (dev, _) in tiers.items() if dev}
        ids, cap = {w.worker_id for w in live}, max(n - 1, 0)
        reusable = {w: min(both * P, cap) for w, (_, both) in tiers.items() if w in ids}
        longest = max(reusable.values(), default=0)
        key = self._observe_demand(request, tiers)
        reuse = self._reuse.update(longest / n) if n else self._reuse.value
        floor = self.config.min_match * n
        least = max(floor, 1)
        cached = {
            w.worker_id: _held(w, reusable, tiers, P)
            if reusable.get(w.worker_id, 0) >= least else (0, 0)
            for w in live
        }  # fmt: skip
        depths = sorted((c for c, _ in cached.values()), reverse=True)
        share = max(1, int(len(depths) * self.config.shared_share))
        c_shared = depths[share] if len(depths) > 1 else 0
        evicted = _evicted_rate(workers, index, reuse)
        total = sum(w.total_pages for w in live)
        full = 1.0 - sum(w.free_pages for w in live if w.total_pages) / total if total else 0.0
        inputs = _Inputs(
            n, P, longest if longest >= floor else 0, c_shared, weight, reuse, evicted,
            reuse * full, outside, _answer_tokens(live),
        )  # fmt: skip
        terms = {w.worker_id: self._ref_terms(w, cached[w.worker_id], inputs) for w in live}
        best, scores = self.lowest(live, [sum(terms[w.worker_id]) for w in live])
        if c_shared and len(best) > 1:
            most = max(cached[w.worker_id][0] for w in best)
            best = [w for w in best if cached[w.worker_id][0] == most]
        pick = self.pick_tied(best, request.fleet, request.cache_key)
        pick, kept = self._keep(pick, live, cached, inputs.c_best, scores, key)
        c = reusable.get(pick.worker_id, 0)
        self._observe_work(request, pick, n - _held(pick, reusable, tiers, P)[0], len(live))
        decided = "margin" if kept else _decided_by(pick.worker_id, scores, terms)
        best_match = inputs.c_best and c == inputs.c_best
        reason = kept or ("ttft: best match" if best_match else "ttft: lowest cost")
        return Decision(pick.worker_id, reason, c, scores, headroom=self.headroom, tiers=found,
                        terms=terms, term_names=TERMS, decided_by=decided)  # fmt: skip

    def _ref_terms(self, w: WorkerState, held: tuple[int, int], p: _Inputs) -> tuple:
        (c, d), n, P = held, p.n, p.page_size
        spill = max(0, n - d - w.free_pages * P) if w.total_pages else 0
        demoted = spill if self.config.tiers and w.load_tokens_per_s > 0 else 0
        if demoted and w.host_total_pages:
            demoted = min(demoted, w.host_free_pages * P)
        spill -= demoted
        shares = not (w.running or w.waiting) or w.worker_id in p.outside
        cc = max(c, p.c_shared) if shares else c
        rate, token_s = w.prefill_tokens_per_s, 1.0 / w.prefill_tokens_per_s
        own = w.prefill_overhead_s + (n - cc) / rate + (w.decode_step_s if w.running else 0.0)
        return (
            w.queued_prefill_tokens / rate,
            own,
            w.load_time(c - d),
            (p.weight + p.stale) * (p.c_best - cc) * token_s,
            p.evicted * spill * token_s + p.reuse * w.load_time(demoted),
            _decode_cost(w, p.answer),
        )


def _held(w: WorkerState, reusable: dict, tiers: dict, page_size: int) -> tuple[int, int]:
    if not (c := reusable.get(w.worker_id, 0)):
        return 0, 0
    d = min(tiers[w.worker_id][0] * page_size, c)
    return (c, d) if w.load_tokens_per_s > 0 else (d, d)


def _decided_by(winner, scores: dict, terms: dict) -> str:
    if not (others := [(s, k) for k, s in scores.items() if k != winner]):
        return "alone"
    _, runner = min(others, key=lambda sk: sk[0])
    if scores[runner] == scores[winner]:
        return "tie"
    gaps = [b - a for a, b in zip(terms[winner], terms[runner], strict=True)]
    return TERMS[max(range(len(gaps)), key=gaps.__getitem__)]


def _evicted_rate(workers: Sequence[WorkerState], index, reuse: float) -> float:
    if pages := sum(w.total_pages + w.host_total_pages for w in workers):
        index.lost.resize(pages)
    return index.lost.rate(reuse)


def _answer_tokens(live: Sequence[WorkerState]) -> float:
    known = [w.answer_tokens for w in live if w.answer_tokens > 0]
    return sum(known) / len(known) if known else 0.0


def _decode_cost(w: WorkerState, answer: float) -> float:
    if not answer:
        return 0.0
    per_token = w.decode_seq_s * (w.running / 2 + w.waiting)
    if w.max_batch_tokens and w.queued_prefill_tokens >= w.max_batch_tokens - w.running:
        per_token += max(w.waiting, 1) / w.prefill_tokens_per_s
    return answer * per_token
