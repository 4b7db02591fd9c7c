"""``build_app(config) -> serve.Application``: radixray as one Ray Serve application.

::

    HTTP (Serve proxy) --> RadixRayRouter (ingress, FastAPI: OpenAI API, /health, /metrics, ...)
                              | RouterService: policy + index, one per ingress replica
                              | pinned calls: generate / poll / abort  (replica=<id>)
                              v
                           RadixRayWorker replicas (one WorkerHost engine each; num_gpus=1 on GPU)

``serve run deploy/serve_config.yaml`` calls this with the ``args`` of the config file; from
Python, ``serve.run(build_app({"model": "tiny"}))``.
"""

from __future__ import annotations

from collections.abc import Mapping

from ray import serve
from ray.serve.config import RequestRouterConfig

from .ingress import RouterIngress
from .replica_router import PinnedReplicaRouter
from .serve_config import ServeAppConfig
from .worker_replica import WorkerReplica

__all__ = ["build_app", "ROUTER_DEPLOYMENT", "WORKER_DEPLOYMENT"]

ROUTER_DEPLOYMENT = "RadixRayRouter"
WORKER_DEPLOYMENT = "RadixRayWorker"


def build_app(config: Mapping | ServeAppConfig | None = None) -> serve.Application:
    """The Serve application for ``config`` (a ``ServeAppConfig`` or its dict form; invalid
    values raise ``ValueError`` here, before anything is deployed)."""
    cfg = config if isinstance(config, ServeAppConfig) else ServeAppConfig.from_dict(config)
    as_dict = _to_dict(cfg)

    worker = serve.deployment(
        WorkerReplica,
        name=WORKER_DEPLOYMENT,
        # The radixray router chooses the replica; Serve's router only delivers to it.
        request_router_config=RequestRouterConfig(request_router_class=PinnedReplicaRouter),
        **cfg.workers.deployment_options(),
    )
    ingress = serve.deployment(
        serve.ingress()(RouterIngress), name=ROUTER_DEPLOYMENT, **cfg.router.deployment_options()
    )
    # Every replica builds its engine config from the same dict; its worker id is its replica id.
    return ingress.bind(worker.bind(cfg.engine_config("")), as_dict)


def _to_dict(cfg: ServeAppConfig) -> dict:
    import dataclasses

    return dataclasses.asdict(cfg)
