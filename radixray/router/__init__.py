"""The global router: policies (``radixray.router.policies``) choose a worker per request,
``request_path.py`` carries each request (admission, retries, its stream and its release),
``worker_pool.py`` keeps the workers' load and the index,
``service.py`` and ``app.py`` serve it over HTTP. Workers are reached through
``radixray.protocol`` (never ``radixray.worker``: a router process does not load torch).

Importing this package stays light (the policies only: no FastAPI, no Ray).
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
