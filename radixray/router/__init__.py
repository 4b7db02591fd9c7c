"""The global router: policies (``radixray.router.policies``) choose a worker per request.

Only the policy layer lives here so far; the worker pool, the dispatch loop and the HTTP app are
added beside it. Importing this package stays light (no FastAPI, no Ray).
"""

from .policies import (
    Decision,
    NoHealthyWorker,
    Policy,
    RoutingRequest,
    WorkerState,
    make_policy,
    policy_names,
    register_policy,
)

__all__ = [
    "Decision",
    "NoHealthyWorker",
    "Policy",
    "RoutingRequest",
    "WorkerState",
    "make_policy",
    "policy_names",
    "register_policy",
]
