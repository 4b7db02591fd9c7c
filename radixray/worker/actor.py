"""The worker as a Ray actor: ``ray.remote`` around ``WorkerHost`` (``host.py``).

A router reaches it through ``radixray.protocol.RayTransport``: ``call(method, payload)`` and
the streaming generator ``stream(method, payload)``, bytes in and out (the protocol's codec),
so nothing is pickled between router and worker.
"""

from __future__ import annotations

from .host import WorkerHost

__all__ = ["WorkerActor", "worker_actor_options"]


def worker_actor_options(
    use_gpu: bool,
    num_cpus: float = 0.5,
    resources: dict | None = None,
    max_concurrency: int = 1000,
) -> dict:
    """Ray options for one worker: a whole GPU, or a fraction of a CPU; optional custom resources
    pin it to a node (``{"node:1.2.3.4": 0.01}`` or a label of the cluster's own)."""
    opts: dict = {"max_concurrency": max_concurrency, "resources": dict(resources or {})}
    if use_gpu:
        opts.update(num_gpus=1, num_cpus=1)
    else:
        opts.update(num_gpus=0, num_cpus=num_cpus)
    return opts


class _RemoteClass:
    """``WorkerActor`` is ``ray.remote(WorkerHost)``, built on first use so that importing this
    module does not import Ray."""

    _cls = None

    def __getattr__(self, name):
        if _RemoteClass._cls is None:
            import ray

            _RemoteClass._cls = ray.remote(WorkerHost)
        return getattr(_RemoteClass._cls, name)


WorkerActor = _RemoteClass()
