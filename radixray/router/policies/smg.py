"""cache_aware and cache_aware_events: SGLang's gateway (``smg`` 1.13.0) as its code decides.

Read from the release's source (PyPI sdist smg-1.13.0, ``model_gateway/src/policies/
cache_aware.rs``, ``least_load.rs``, ``worker/expected_wait.rs``; no VCS commit is recorded in it).
Both rules end the same way: a set of candidate workers, a spill gate, then the lowest
*expected wait*, ties (within 1e-6) drawn at random.

**Eligible workers**: healthy and, with smg's worker overload protection (on by default), not
over ``overload_waiting`` waiting requests or ``overload_usage`` of their KV pool, unless every
worker is over (then all are eligible).

**Candidates**:

- ``cache_aware`` (text mode, what smg runs in front of HTTP workers): smg keeps its own tree of
  the prompts it routed (one tree for all workers, each entry naming the worker it was sent to,
  trimmed least-recently-used first to ``max_tree_tokens``; smg counts characters, 2^26 by
  default, and trims every 60 s). A match of the prompt's prefix over ``cache_threshold`` of it
  (strictly) makes the workers holding the deepest matched entry the candidates; a lower match
  has none. The tree is this policy's own, fed by its own dispatches, never by the workers: it
  does not know what they evicted.
- ``cache_aware_events`` (event mode, fed by the workers' KV events; smg subscribes to them from
  gRPC workers only): the workers whose cached prefix of the prompt is deepest in the router's
  event-fed index, from one block on. No threshold.

**Spill gate** (``load`` = requests the router has outstanding on a worker, ``avg`` its mean over
the eligible workers)::

    margin(avg) = min(balance_abs_threshold, max(ceil(2 * sqrt(avg)), 4))
    spill(w)    = load(w) > balance_rel_threshold * avg  and  load(w) > avg + margin(avg)

Candidates under the gate are kept; if every candidate spills, the eligible workers under the
gate (all of them if none is); no candidate: every eligible worker.

**Expected wait** (seconds; smg's constants: 1,024 tokens per request of unknown size, 2,000
tokens/s when a worker reports no throughput, 0.15 s of KV pressure weight)::

    queued = queued_prefill_tokens, or waiting * 1024 when it reports none
    wait   = (queued + running * 1024) / throughput + 0.15 * k / (1 - k)

``throughput`` is the worker's decode tokens per second (``running / decode_step_s``), ``k``
the share of its pool that requests hold. smg reads these from ``/v1/loads`` every 10 s and
credits the tokens it dispatched since; the simulator's reports are current, so there is no
credit to add. Not modelled: smg's warm-up slice (only for workers that joined under 60 s ago
while others had not; the simulator's fleet starts together) and its opt-in settings
(``overlap_decay``, ``selection_temperature``, booking TTLs, KV-spread thresholds).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable, Sequence

from .base import Decision, Policy, RoutingRequest, WorkerState, healthy, register_policy

__all__ = ["SmgCacheAware", "SmgCacheAwareEvents", "expected_wait", "spills"]

MEAN_PREFILL_TOKENS = 1024
DEFAULT_THROUGHPUT = 2000.0
KV_PRESSURE_WEIGHT = 0.15


def kv_usage(w: WorkerState, page_size: int) -> float:
    """The share of ``w``'s pool its requests hold (cached pages nobody holds are free)."""
    pool = w.total_pages * page_size
    return min(1.0, w.active_decode_tokens / pool) if pool else 0.0


def expected_wait(w: WorkerState, page_size: int) -> float:
    queued = w.queued_prefill_tokens or w.waiting * MEAN_PREFILL_TOKENS
    work = queued + w.running * MEAN_PREFILL_TOKENS
    rate = w.running / w.decode_step_s if w.running and w.decode_step_s > 0 else 0.0
    k = min(max(kv_usage(w, page_size), 0.0), 0.999)
    return work / (rate or DEFAULT_THROUGHPUT) + KV_PRESSURE_WEIGHT * k / (1 - k)


def spills(load: int, avg: float, abs_threshold: float, rel_threshold: float) -> bool:
    margin = min(abs_threshold, max(math.ceil(2 * math.sqrt(avg)), 4))
    return load > rel_threshold * avg and load > avg + margin


class _Smg(Policy):
    def __init__(
        self,
        seed: int | None = 0,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
        overload_waiting: int = 8,
        overload_usage: float = 0.8,
    ):
        super().__init__(seed)
        if balance_rel_threshold < 1:
            raise ValueError(f"balance_rel_threshold must be >= 1, got {balance_rel_threshold}")
        if overload_waiting < 1 or not 0 < overload_usage <= 1:
            raise ValueError(
                "overload_waiting must be >= 1 and overload_usage in (0, 1], got "
                f"{overload_waiting}, {overload_usage}"
            )
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.overload_waiting = overload_waiting
        self.overload_usage = overload_usage

    def eligible(self, workers: Sequence[WorkerState], page_size: int) -> list[WorkerState]:
        live = healthy(workers)
        under = [
            w
            for w in live
            if w.waiting < self.overload_waiting and kv_usage(w, page_size) < self.overload_usage
        ]
        return under or live

    def resolve(
        self, candidates: list[WorkerState], eligible: list[WorkerState], page_size: int
    ) -> tuple[WorkerState, dict]:
        """The spill gate over ``candidates``, then the lowest expected wait (random ties)."""
        pool = eligible
        if candidates:
            avg = sum(w.load for w in eligible) / len(eligible)
            abs_t, rel_t = self.balance_abs_threshold, self.balance_rel_threshold
            kept = [w for w in candidates if not spills(w.load, avg, abs_t, rel_t)]
            under = [w for w in eligible if not spills(w.load, avg, abs_t, rel_t)]
            pool = kept or under or eligible
        waits = {w.worker_id: expected_wait(w, page_size) for w in pool}
        low = min(waits.values())
        best = [w for w in pool if waits[w.worker_id] <= low + 1e-6]
        return self.rng.choice(best) if len(best) > 1 else best[0], waits


@register_policy("cache_aware")
class SmgCacheAware(_Smg):
    def __init__(
        self,
        seed: int | None = 0,
        cache_threshold: float = 0.3,
        max_tree_tokens: int = 2**26,
        **gates,
    ):
        super().__init__(seed, **gates)
        if not 0.0 <= cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {cache_threshold}")
        if max_tree_tokens < 1:
            raise ValueError(f"max_tree_tokens must be >= 1, got {max_tree_tokens}")
        self.cache_threshold = cache_threshold
        self.max_tree_tokens = max_tree_tokens
        # (block hash, worker) -> None, least recently used first: the router's own text tree
        # (block hashes chain their prefix, so a hash stands for the node ending there).
        self._tree: OrderedDict[tuple[int, Hashable], None] = OrderedDict()
        self._holders: dict[int, set] = {}
        self._page_size = 1

    def match(self, hashes: Sequence[int]) -> tuple[int, set]:
        """(depth in blocks, the workers holding the deepest matched entry)."""
        depth, holders = 0, set()
        for h in hashes:
            found = self._holders.get(h)
            if not found:
                break
            depth, holders = depth + 1, found
        return depth, holders

    def choose(self, request: RoutingRequest, workers: Sequence[WorkerState], index) -> Decision:
        P = self._page_size = index.page_size
        eligible = self.eligible(workers, P)
        depth, holders = self.match(request.block_hashes)
        hit = request.num_tokens and depth * P / request.num_tokens > self.cache_threshold
        candidates = [w for w in eligible if w.worker_id in holders] if hit else []
        pick, waits = self.resolve(candidates, eligible, P)
        held = pick.worker_id in holders
        reason = "cache_aware: match" if candidates else "cache_aware: low match -> expected wait"
        return Decision(pick.worker_id, reason, depth * P if held else 0, waits)

    def on_dispatch(self, decision: Decision, request: RoutingRequest) -> None:
        wid, tree = decision.worker_id, self._tree
        for h in reversed(request.block_hashes):  # the deepest first: leaves leave before roots
            key = (h, wid)
            if key in tree:
                tree.move_to_end(key)
            else:
                tree[key] = None
                self._holders.setdefault(h, set()).add(wid)
        limit = self.max_tree_tokens // self._page_size
        while len(tree) > limit:
            (h, w), _ = tree.popitem(last=False)
            held = self._holders[h]
            held.discard(w)
            if not held:
                del self._holders[h]


@register_policy("cache_aware_events")
class SmgCacheAwareEvents(_Smg):
    def choose(self, request: RoutingRequest, workers: Sequence[WorkerState], index) -> Decision:
        P = index.page_size
        eligible = self.eligible(workers, P)
        matched = index.match(request.block_hashes) if request.block_hashes else {}
        ids = {w.worker_id for w in eligible}
        top = max((n for w, n in matched.items() if w in ids), default=0)
        candidates = [w for w in eligible if top and matched.get(w.worker_id, 0) == top]
        pick, waits = self.resolve(candidates, eligible, P)
        why = "deepest" if candidates else "expected wait"
        reason = f"cache_aware_events: {why}"
        return Decision(pick.worker_id, reason, matched.get(pick.worker_id, 0) * P, waits)
