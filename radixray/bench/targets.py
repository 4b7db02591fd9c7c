"""A live benchmark's target: a router, its policy spec and, optionally, the workers it runs on.

``ROUTER:POLICY[@KEY=VALUE,...]``: ``radixray:ttft``, ``radixray:ttft:tiers=false`` (the policy
spec is everything after the first colon, as ``radixray serve --policy`` takes it),
``smg:cache_aware``, ``smg:cache_aware:cache-threshold=0.5`` (SGLang's gateway with its flags,
``peer_smg.smg_args``), ``smg-grpc:cache_aware`` (smg's event-driven mode: the workers also
serve gRPC, smg is given their ``grpc://`` addresses and indexes their KV events),
``radixray:ttft@host-pages=0``. What follows ``@`` changes the workers
that target's runs start (each run starts fresh workers anyway), so that targets which differ in
the workers' configuration, not only in the router, run side by side in one comparison: every
other target keeps the comparison's own worker flags.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .local_cluster import WorkerSpec
from .peer_smg import smg_args

__all__ = ["Target", "parse_target", "ROUTERS", "WORKER_KEYS"]

ROUTERS = ("radixray", "smg", "smg-grpc")


def _pages(key: str, text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(f"{key} must be an int >= 0, got {text!r}")
    return n


# target suffix key -> (WorkerSpec field, parser)
WORKER_KEYS = {
    "host-pages": ("host_pages", _pages),
    "num-pages": ("num_pages", _pages),
}


@dataclass(frozen=True)
class Target:
    name: str  # the whole spec, as given: the label of rows, logs and plots
    router: str
    policy: str
    worker: dict  # WorkerSpec fields this target overrides

    def worker_spec(self, base: WorkerSpec) -> WorkerSpec:
        """The workers this target runs on: ``base`` with this target's overrides."""
        return replace(base, **self.worker) if self.worker else base


def parse_target(spec: str) -> Target:
    """``ROUTER:POLICY[@KEY=VALUE,...]`` as a Target; ValueError naming what is wrong."""
    head, at, tail = spec.partition("@")
    router, _, policy = head.partition(":")
    if router not in ROUTERS or not policy:
        raise ValueError(
            f"target must be radixray:<policy>, smg:<policy> or smg-grpc:<policy> "
            f"(then @host-pages=N,...), got {spec!r}"
        )
    if router in ("smg", "smg-grpc"):
        smg_args(policy)  # ValueError naming a bad smg option
    worker: dict = {}
    if at:
        for part in tail.split(","):
            key, eq, value = part.partition("=")
            if not eq or key not in WORKER_KEYS:
                raise ValueError(
                    f"target {spec!r}: after @ expected KEY=VALUE with KEY one of "
                    f"{sorted(WORKER_KEYS)}, got {part!r}"
                )
            field_name, parse = WORKER_KEYS[key]
            worker[field_name] = parse(key, value)
    return Target(spec, router, policy, worker)
