"""Cache-blind baselines: round_robin, random, least_load, power_of_two.

They never look at the index (``predicted_cached_tokens`` is 0). Load is the number of outstanding
requests (running + waiting), the quantity SGLang's and Ray Serve's routers balance.
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import Decision, Policy, RoutingRequest, WorkerState, healthy, register_policy

__all__ = ["RoundRobin", "RandomPolicy", "LeastLoad", "PowerOfTwo"]


@register_policy("round_robin")
class RoundRobin(Policy):
    """Cycle through the healthy workers in the order given (an unhealthy worker is skipped)."""

    def __init__(self, seed: int | None = 0):
        super().__init__(seed)
        self._next = 0

    def choose(self, request: RoutingRequest, workers: Sequence[WorkerState], index) -> Decision:
        live = healthy(workers)
        w = live[self._next % len(live)]
        self._next += 1
        return Decision(w.worker_id, "round_robin")


@register_policy("random")
class RandomPolicy(Policy):
    """Uniform over the healthy workers (seeded: same seed, same choices)."""

    def choose(self, request: RoutingRequest, workers: Sequence[WorkerState], index) -> Decision:
        live = healthy(workers)
        return Decision(self.rng.choice(live).worker_id, "random")


@register_policy("least_load")
class LeastLoad(Policy):
    """Fewest outstanding requests; ties go to the worker with less queued prefill work, then to
    the first in the order given (deterministic, like SGLang's ``min_by_key``)."""

    def choose(self, request: RoutingRequest, workers: Sequence[WorkerState], index) -> Decision:
        live = healthy(workers)
        best = min(live, key=lambda w: (w.load, w.queued_prefill_tokens))
        return Decision(best.worker_id, "least_load", scores={w.worker_id: w.load for w in live})


@register_policy("power_of_two")
class PowerOfTwo(Policy):
    """Sample two distinct healthy workers, take the less loaded (the first sampled on a tie)."""

    def choose(self, request: RoutingRequest, workers: Sequence[WorkerState], index) -> Decision:
        live = healthy(workers)
        if len(live) == 1:
            return Decision(live[0].worker_id, "power_of_two: only one worker")
        a, b = self.rng.sample(live, 2)
        best = b if b.load < a.load else a
        return Decision(
            best.worker_id, "power_of_two", scores={a.worker_id: a.load, b.worker_id: b.load}
        )
