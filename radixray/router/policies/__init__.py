"""Routing policies: one file per family, one registry by name.

>>> from radixray.router.policies import make_policy, policy_names
>>> policy = make_policy("ttft", seed=0)
>>> "round_robin" in policy_names()
True
"""

from .base import (
    Decision,
    NoHealthyWorker,
    Policy,
    RoutingRequest,
    WorkerState,
    healthy,
    make_policy,
    policy_names,
    register_policy,
)
from .cache_aware import CacheAwareV03
from .hashing import ConsistentHash
from .kv_cost import KvCost
from .load import LeastLoad, PowerOfTwo, RandomPolicy, RoundRobin
from .smg import SmgCacheAware, SmgCacheAwareEvents
from .ttft import PredictedTTFT

__all__ = [
    "CacheAwareV03",
    "ConsistentHash",
    "Decision",
    "KvCost",
    "LeastLoad",
    "NoHealthyWorker",
    "Policy",
    "PowerOfTwo",
    "PredictedTTFT",
    "RandomPolicy",
    "RoundRobin",
    "RoutingRequest",
    "SmgCacheAware",
    "SmgCacheAwareEvents",
    "WorkerState",
    "healthy",
    "make_policy",
    "policy_names",
    "register_policy",
]
