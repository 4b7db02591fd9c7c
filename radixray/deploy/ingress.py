"""The ingress deployment: radixray's router (the same FastAPI app as ``radixray serve``) in a
Serve replica, with the worker deployment's replicas as its workers.

Each ingress replica owns a ``RouterService`` (its own index, fed by every worker replica's KV
events through pinned ``poll`` calls) and a ``ReplicaMembership`` that follows Serve's replica
set. The app is built at replica start (``__serve_build_asgi_app__``, Serve's late-bound ASGI
ingress), because it wraps this replica's service; its lifespan waits for the first worker so
that the application only reports RUNNING once it can answer.
"""

from __future__ import annotations

import logging

from radixray.model_meta import load_model_meta
from radixray.router.app import build_app
from radixray.router.fleet_metrics import RayKVStore
from radixray.router.service import RouterService

from .membership import ReplicaMembership
from .replicas import running_replicas
from .serve_client import serve_worker_client
from .serve_config import ServeAppConfig

__all__ = ["RouterIngress"]


def _own_replica_id() -> str | None:
    """This ingress replica's Serve id (its router id), or None outside Serve (tests)."""
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # not in a Serve replica: the service names itself
        return None


log = logging.getLogger(__name__)


class RouterIngress:
    def __init__(self, workers, config: dict):
        """``workers``: the worker deployment's handle; ``config``: ``ServeAppConfig`` as a dict
        (what ``build_app`` was given)."""
        self.config = cfg = ServeAppConfig.from_dict(config)
        self.service = RouterService(
            load_model_meta(cfg.model, cfg.served_model_name),
            cfg.router_settings(router_id=_own_replica_id()),
        )
        # A scrape reaches whichever replica Serve's proxy picks: each one shows the fleet's.
        self.service.share_metrics(RayKVStore())
        app_name, dep_name = workers.app_name, workers.deployment_name

        def is_running(rid: str) -> bool:
            ids = running_replicas(app_name, dep_name)
            return ids is None or rid in ids

        self.membership = ReplicaMembership(
            self.service,
            lambda: running_replicas(app_name, dep_name),
            lambda rid: serve_worker_client(workers, rid, is_running),
        )
        # Creating the streaming handle starts the handle's router, which starts hearing the
        # replica set: membership is known without sending a request first.
        self._workers = workers.options(stream=False)

    async def _startup(self) -> None:
        """Wait (bounded) until Serve's initial worker replicas have joined, so that the app
        reports RUNNING with its workers in the pool; later ones join in the background."""
        wait_s = self.config.router.startup_wait_s
        want = self.config.workers.initial_replicas
        n = await self.membership.wait_for_workers(want, wait_s)
        if n < want:
            log.warning(
                "%d of %d worker replicas joined within %.0f s; the rest join when ready",
                n,
                want,
                wait_s,
            )
        self.membership.start()

    def __serve_build_asgi_app__(self):
        app = build_app(self.service, on_startup=[self._startup])
        app.state.membership = self.membership
        return app

    async def __del__(self):
        await self.membership.stop()
        await self.service.stop()
