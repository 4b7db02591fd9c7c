"""consistent_hash: session affinity on a hash ring, with bounded loads.

Each worker owns ``vnodes`` points on a 64-bit ring (xxh3 of ``"{worker_id}#{i}"``). A request's
key (its session key; without one, its first block hash, so one system prompt sticks to one
worker; without either, its request id) hashes to a point, and the request goes to the first
worker clockwise whose load is under the bound of Mirrokni, Thorup and Zadimoghaddam,
"Consistent Hashing with Bounded Loads" (2018)::

    capacity = ceil((1 + epsilon) * (total_load + 1) / num_workers)

so no worker holds more than (1 + epsilon) times the average; the walk skips full workers. The
ring is rebuilt only when the set of healthy workers changes.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

import xxhash

from .base import Decision, Policy, RoutingRequest, WorkerState, healthy, register_policy

__all__ = ["ConsistentHash"]


def _h64(s: str) -> int:
    return xxhash.xxh3_64_intdigest(s.encode())


@register_policy("consistent_hash")
class ConsistentHash(Policy):
    def __init__(self, seed: int | None = 0, epsilon: float = 0.25, vnodes: int = 64):
        super().__init__(seed)
        if epsilon <= 0:
            raise ValueError(f"epsilon must be > 0, got {epsilon}")
        if vnodes < 1:
            raise ValueError(f"vnodes must be >= 1, got {vnodes}")
        self.epsilon = epsilon
        self.vnodes = vnodes
        self._members: tuple = ()
        self._points: list[int] = []
        self._owners: list = []

    def _ring(self, ids: tuple) -> None:
        if ids == self._members:
            return
        pts = sorted((_h64(f"{wid}#{i}"), wid) for wid in ids for i in range(self.vnodes))
        self._points = [p for p, _ in pts]
        self._owners = [w for _, w in pts]
        self._members = ids

    @staticmethod
    def key_of(request: RoutingRequest) -> str:
        if request.session_key is not None:
            return f"s:{request.session_key}"
        if request.block_hashes:
            return f"b:{request.block_hashes[0]}"
        return f"r:{request.request_id}"

    def choose(self, request: RoutingRequest, workers: Sequence[WorkerState], index) -> Decision:
        live = healthy(workers)
        by_id = {w.worker_id: w for w in live}
        self._ring(tuple(by_id))
        total = sum(w.load for w in live)
        cap = math.ceil((1 + self.epsilon) * (total + 1) / len(live))
        start = bisect.bisect_left(self._points, _h64(self.key_of(request)))
        n = len(self._points)
        seen = set()
        for k in range(n):
            wid = self._owners[(start + k) % n]
            if wid in seen:
                continue
            seen.add(wid)
            if by_id[wid].load < cap:
                reason = "consistent_hash: home" if k == 0 else "consistent_hash: home full"
                return Decision(wid, reason, scores={"capacity": cap})
            if len(seen) == len(live):
                break
        # Unreachable in practice (the bound always leaves room), kept as a safe fallback.
        best = min(live, key=lambda w: w.load)
        return Decision(best.worker_id, "consistent_hash: all full", scores={"capacity": cap})
