"""Operations routes: /health, /metrics, /debug/*, and the token-protected /admin/*.

Module-level handlers; the ``RouterService`` they serve comes from the app's state, declared
once as a dependency, and the guards (admin token, debug switch) are dependencies too.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from radixray.api import ApiError
from radixray.api.auth import bearer_matches
from radixray.protocol import cache_view

from .service import RouterService

__all__ = ["ops_router"]


async def _service(request: Request) -> RouterService:
    return request.app.state.service


Service = Annotated[RouterService, Depends(_service)]


async def require_admin(request: Request, service: Service) -> None:
    token = service.settings.admin_token
    if not token:
        raise ApiError(
            404, "admin routes are disabled (no admin token configured)", code="admin_disabled"
        )
    if not bearer_matches(request.headers.get("authorization"), token):
        raise ApiError(
            401,
            "a valid admin bearer token is required",
            "authentication_error",
            code="invalid_token",
            headers={"WWW-Authenticate": "Bearer"},
        )


async def require_debug(service: Service) -> None:
    if not service.settings.enable_debug:
        raise ApiError(404, "debug routes are disabled", code="debug_disabled")


class AddWorker(BaseModel):
    model_config = ConfigDict(extra="forbid")
    worker_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")
    engine: dict = Field(default_factory=dict)  # EngineConfig fields for the new worker


def _digest(hashes) -> str:
    """Order-free fingerprint of a set of block hashes: two routers whose views of a worker
    agree report the same digest."""
    return f"{len(hashes)}:{sum(hashes) % (1 << 64):016x}"


ops_router = APIRouter()
admin = [Depends(require_admin)]
debug = [Depends(require_debug)]


@ops_router.get("/health")
async def health(service: Service):
    """200 once the router can route with a warm index; 503 "warming" before (a router that
    joins a fleet rebuilds its index from the workers' snapshots first) or "unavailable"."""
    ready, body = service.health()
    return JSONResponse(body, status_code=200 if ready else 503)


@ops_router.get("/metrics")
async def metrics(service: Service):
    """This router's metrics, and the fleet's counters summed where routers share a store."""
    text = await service.render_metrics()
    return Response(text, media_type="text/plain; version=0.0.4")


@ops_router.get("/debug/decisions", dependencies=debug)
async def decisions(service: Service, limit: int = 100):
    limit = max(1, min(limit, len(service.router.dispatch.decisions) or 1))
    recs = list(service.router.dispatch.decisions)[-limit:]
    return {
        "router_id": service.router_id,
        "decisions": [r.as_dict() for r in recs],
        "policy": service.policy.name,
        "mispredictions": service.router.dispatch.mispredictions,
        "herding": list(service.router.dispatch.herd.active.values()),
    }


@ops_router.get("/debug/cache", dependencies=debug)
async def cache(service: Service):
    out = {}
    for e in service.pool.workers.values():
        out[e.worker_id] = cache_view(e.report, e.counters) | {
            "healthy": e.healthy,
            "draining": e.draining,
            "index_blocks": service.index.num_blocks(e.worker_id),
            "index_digest": _digest(service.index.blocks(e.worker_id)),
            "events_applied": e.events_applied,
            "snapshots": e.snapshots,
        }
    return {"workers": out, "index": service.index.stats()}


@ops_router.get("/admin/workers", dependencies=admin)
async def list_workers(service: Service):
    return {
        "workers": [
            {
                "worker_id": e.worker_id,
                "healthy": e.healthy,
                "draining": e.draining,
                "inflight": len(e.inflight),
                "info": msgspec.structs.asdict(e.info),
            }
            for e in service.pool.workers.values()
        ]
    }


@ops_router.post("/admin/workers", dependencies=admin, status_code=201)
async def add_worker(body: AddWorker, service: Service):
    if service.worker_factory is None:
        raise ApiError(501, "this deployment cannot start workers", code="not_supported")
    if body.worker_id in service.pool.workers:
        raise ApiError(409, f"worker {body.worker_id!r} exists", param="worker_id")
    try:
        client = await service.worker_factory({"worker_id": body.worker_id, **body.engine})
        await service.add_worker(client)
    except (ValueError, TypeError) as e:
        raise ApiError(400, str(e), param="engine") from None
    return {"worker_id": body.worker_id, "status": "added"}


@ops_router.delete("/admin/workers/{worker_id}", dependencies=admin, status_code=202)
async def remove_worker(worker_id: str, service: Service):
    if worker_id not in service.pool.workers:
        raise ApiError(404, f"no worker {worker_id!r}", param="worker_id")
    service.start_drain(worker_id)
    return {"worker_id": worker_id, "status": "draining"}
