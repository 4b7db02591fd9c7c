"""``Dispatcher``: the steps of routing that do not wait on a worker, one copy for the live
router and the simulator.

    decide    policy.choose over the routable workers -> the decision and its record (with the
              reuse telemetry by the index: *available*, the longest prefix any worker holds,
              and *captured*, what the chosen worker holds, whatever the policy predicted, each
              over both tiers with its host-only part beside it); the
              herding alarm sees it; the request's blocks go into the index on the chosen worker
              (optimistic: it will hold them after prefill); policy.on_dispatch
    complete  the worker's actual cached tokens (*delivered*) go on the record and back to the
              policy
              (on_complete); a shortfall against the prediction is a misprediction (the
              index's view of that worker was stale), counted and returned so that the caller
              can resync that worker

What differs between the two callers stays with them: the live router's ``RoutedRequest``
(``request_path.py``) wraps ``decide`` in its retry loop around a real stream and keeps its
place in its worker's load tally; the simulator
calls ``decide`` at each arrival and ``complete`` at each finish in simulated time.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass, field

from radixray.cache_index import ApproxIndex

from .herding import HerdAlarm
from .policies import Decision, Policy, RoutingRequest, WorkerState

__all__ = ["DecisionRecord", "Dispatcher"]

log = logging.getLogger(__name__)


@dataclass
class DecisionRecord:
    """One routing decision and what came of it (``/debug/decisions``, the metrics)."""

    request_id: str
    worker_id: str
    router_id: str | None
    reason: str
    prompt_tokens: int
    predicted_cached_tokens: int  # the policy's prediction (0 for policies that do not match)
    actual_cached_tokens: int | None = None  # delivered: what the worker reused
    available_tokens: int = 0  # the longest cached prefix any worker held (index, at decision)
    captured_tokens: int = 0  # the prefix the chosen worker held (index, at decision)
    completion_tokens: int | None = None
    queued_prefill_tokens: int = 0
    running: int = 0
    attempts: int = 1
    # the fleet's spare capacity as the policy estimated it at decision (1 - rho; <= 0:
    # saturated); None for policies that do not estimate it
    headroom: float | None = None
    ttft_s: float | None = None
    latency_s: float | None = None
    finish_reason: str | None = None
    error: str | None = None
    ts: float = field(default_factory=time.time)
    scores: dict = field(default_factory=dict)
    miss: dict | None = None
    # Of available and captured, what only host tiers held (docs/host_tier.md): a load-back,
    # not a device hit; the delivered split is the worker's ``miss["host"]``.
    available_host_tokens: int = 0
    captured_host_tokens: int = 0
    # The prefill fit the policy priced the chosen worker with (``overhead + tokens / rate``,
    # pooled over its performance class): what its time predictions and headroom rest on.
    prefill_tokens_per_s: float | None = None
    prefill_overhead_s: float | None = None
    # For a policy whose score is a sum of named terms (ttft): each candidate's terms in
    # seconds, in ``term_names`` order, and the term that separated the winner from the
    # runner-up (docs/ttft_policy.md, "Reading a decision").
    terms: dict | None = None
    term_names: tuple = ()
    decided_by: str | None = None

    def as_dict(self) -> dict:
        d = asdict(self)
        d["scores"] = {
            str(k): round(v, 6) if isinstance(v, float) else v for k, v in self.scores.items()
        }
        if self.terms is not None:
            names = self.term_names
            d["terms"] = {
                str(k): {n: round(v, 6) for n, v in zip(names, vs, strict=True)}
                for k, vs in self.terms.items()
            }
        del d["term_names"]
        return d


def _finite(x: float | None) -> float | None:
    """A headroom for JSON and logs: rounded, and None where no finite estimate exists yet."""
    return round(x, 4) if x is not None and math.isfinite(x) else None


def _reuses(states: Sequence[WorkerState], wid) -> bool:
    """Whether worker ``wid``'s cache keeps prefixes (``WorkerState.reuses``)."""
    return next((s.reuses for s in states if s.worker_id == wid), True)


class Dispatcher:
    def __init__(
        self,
        policy: Policy,
        index: ApproxIndex,
        *,
        router_id: str | None = None,
        optimistic: bool = True,
        herd_window: int = 64,
        decision_log_size: int = 1024,
    ):
        """``optimistic``: index a request's blocks on its worker at once (else only KV events
        teach the index); ``decision_log_size``: finished decisions kept for /debug."""
        self.policy = policy
        self.index = index
        self.router_id = router_id
        self.optimistic = optimistic
        self.herd = HerdAlarm(herd_window) if herd_window else None  # 0: no alarm (simulator)
        self.decisions: deque[DecisionRecord] = deque(maxlen=decision_log_size)
        self.listeners: list[Callable[[DecisionRecord], None]] = []  # on completion (metrics)
        self.mispredictions = 0

    def decide(
        self, request: RoutingRequest, states: Sequence[WorkerState], attempt: int = 1
    ) -> tuple[Decision, DecisionRecord]:
        """Choose a worker for ``request`` and commit the router to it. Raises the policy's
        ``NoHealthyWorker`` when ``states`` is empty."""
        decision = self.policy.choose(request, states, self.index)
        wid = decision.worker_id
        record = self._record(request, decision, states, attempt)
        if self.herd is not None:
            self.herd.observe(wid, states, record)
        if self.optimistic and request.block_hashes and _reuses(states, wid):
            self.index.insert(wid, request.block_hashes)
        self.policy.on_dispatch(decision, request)
        return decision, record

    def first_token(self, record: DecisionRecord, request_id: Hashable) -> None:
        """The request's first token arrived from its worker (told to a policy that has the
        hook: one written to the contract before it may not)."""
        hook = getattr(self.policy, "on_first_token", None)
        if hook is not None:
            hook(request_id, record.worker_id)

    def abandon(self, record: DecisionRecord, request_id: Hashable) -> None:
        """The request ended without an answer (an error, an abort): the policy forgets it,
        with no misprediction counted."""
        self.policy.on_complete(request_id, record.worker_id, 0)

    def complete(self, record: DecisionRecord, request_id: Hashable, actual_cached: int) -> bool:
        """The request finished with ``actual_cached`` tokens reused on its worker. Returns
        True when that fell short of the prediction (the caller resyncs that worker)."""
        record.actual_cached_tokens = actual_cached
        self.policy.on_complete(request_id, record.worker_id, actual_cached)
        mispredicted = actual_cached < record.predicted_cached_tokens
        self.mispredictions += mispredicted
        return mispredicted

    def log(self, record: DecisionRecord) -> None:
        """Keep a finished (or failed) decision and tell the listeners."""
        self.decisions.append(record)
        for fn in self.listeners:
            try:
                fn(record)
            except Exception:  # metrics must never break serving
                log.exception("decision listener failed")

    def _record(
        self, rr: RoutingRequest, d: Decision, states: Sequence[WorkerState], attempt: int
    ) -> DecisionRecord:
        st = next((s for s in states if s.worker_id == d.worker_id), None)
        # A worker reuses at most the page-aligned first n - 1 tokens (one is always computed).
        P = self.index.page_size
        cap = (rr.num_tokens - 1) // P * P if rr.num_tokens else 0
        tiers = d.tiers
        if tiers is None:  # the policy did not read the index's tiers (the record's own walk)
            tiers = self.index.match_tiers(rr.block_hashes) if rr.block_hashes else {}
        # prefixes over both tiers; the device-only ones under them
        available = min(max((b for _, b in tiers.values()), default=0) * P, cap)
        available_device = min(max((dv for dv, _ in tiers.values()), default=0) * P, cap)
        device, both = tiers.get(d.worker_id, (0, 0))
        captured, captured_device = min(both * P, cap), min(device * P, cap)
        return DecisionRecord(
            request_id=str(rr.request_id),
            worker_id=d.worker_id,
            router_id=self.router_id,
            reason=d.reason,
            prompt_tokens=rr.num_tokens,
            predicted_cached_tokens=min(d.predicted_cached_tokens, cap),
            available_tokens=available,
            captured_tokens=captured,
            queued_prefill_tokens=st.queued_prefill_tokens if st else 0,
            running=st.running if st else 0,
            attempts=attempt,
            headroom=_finite(d.headroom),
            scores=dict(d.scores),
            available_host_tokens=available - available_device,
            captured_host_tokens=captured - captured_device,
            prefill_tokens_per_s=st.prefill_tokens_per_s if st else None,
            prefill_overhead_s=st.prefill_overhead_s if st else None,
            terms=d.terms,
            term_names=d.term_names,
            decided_by=d.decided_by,
        )
