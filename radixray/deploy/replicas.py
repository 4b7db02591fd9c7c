"""The worker replicas this process's Serve router can address, and the pinning protocol.

Kept apart from ``replica_router``: Serve ships a request router class *by value* (cloudpickle,
module registered for pickle-by-value), so module-level state defined beside the class would be
a private copy in every process that unpickles it. State and exception types live here, a
module imported by reference, so the router and the ingress share them.

Routers run on Serve's router event loop (its own thread in a replica); the table is replaced,
never mutated in place, so a reader on another thread sees one consistent frozenset.
"""

from __future__ import annotations

import threading

__all__ = ["TARGET_KWARG", "ReplicaGone", "publish", "running_replicas"]

# The keyword argument that names the target replica in every pinned call.
TARGET_KWARG = "replica"

_lock = threading.Lock()
_members: dict[tuple[str, str], frozenset[str]] = {}


class ReplicaGone(RuntimeError):
    """The target replica is not (or no longer) running."""


def publish(app_name: str, deployment_name: str, replica_ids) -> None:
    with _lock:
        _members[(app_name, deployment_name)] = frozenset(replica_ids)


def running_replicas(app_name: str, deployment_name: str) -> frozenset[str] | None:
    """The unique ids of the deployment's running replicas as this process's router last heard
    them; None until a router for that deployment exists in this process."""
    return _members.get((app_name, deployment_name))
