"""Operations routes: /health, /metrics, /debug/*, and the token-protected /admin/*."""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from .errors import ApiError
from .service import RouterService

__all__ = ["ops_routes"]


class AddWorker(BaseModel):
    model_config = ConfigDict(extra="forbid")
    worker_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")
    engine: dict = Field(default_factory=dict)  # EngineConfig fields for the new worker


def _digest(hashes) -> str:
    """Order-free fingerprint of a set of block hashes: two routers whose views of a worker
    agree report the same digest."""
    return f"{len(hashes)}:{sum(hashes) % (1 << 64):016x}"


def ops_routes(service: RouterService) -> APIRouter:
    api = APIRouter()
    s = service.settings

    def require_admin(request: Request) -> None:
        if not s.admin_token:
            raise ApiError(
                404, "admin routes are disabled (no admin token configured)", code="admin_disabled"
            )
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        ok = scheme.lower() == "bearer" and hmac.compare_digest(
            token.encode(), s.admin_token.encode()
        )
        if not ok:
            raise ApiError(
                401,
                "a valid admin bearer token is required",
                "authentication_error",
                code="invalid_token",
                headers={"WWW-Authenticate": "Bearer"},
            )

    def require_debug() -> None:
        if not s.enable_debug:
            raise ApiError(404, "debug routes are disabled", code="debug_disabled")

    @api.get("/health")
    async def health():
        live = service.pool.routable()
        body = {
            "status": "ok" if live else "unavailable",
            "model": service.model_name,
            "workers": len(service.pool.workers),
            "healthy_workers": len(live),
        }
        return JSONResponse(body, status_code=200 if live else 503)

    @api.get("/metrics")
    async def metrics():
        service.metrics.refresh(service.pool)
        return Response(service.metrics.render(), media_type="text/plain; version=0.0.4")

    @api.get("/debug/decisions", dependencies=[Depends(require_debug)])
    async def decisions(limit: int = 100):
        limit = max(1, min(limit, len(service.router.decisions) or 1))
        recs = list(service.router.decisions)[-limit:]
        return {
            "decisions": [r.as_dict() for r in recs],
            "policy": service.policy.name,
            "mispredictions": service.router.mispredictions,
        }

    @api.get("/debug/cache", dependencies=[Depends(require_debug)])
    async def cache():
        out = {}
        for e in service.pool.workers.values():
            st = e.stats
            out[e.worker_id] = {
                "healthy": e.healthy,
                "draining": e.draining,
                "hit_rate": st.get("hit_rate"),
                "prompt_tokens": st.get("prompt_tokens"),
                "cached_tokens": st.get("cached_tokens"),
                "miss_tokens": st.get("miss_tokens"),
                "evicted_pages": st.get("evicted_pages"),
                "preemptions": st.get("preemptions"),
                "cached_pages": st.get("cached_pages"),
                "free_pages": st.get("free_pages"),
                "total_pages": st.get("total_pages"),
                "index_blocks": service.index.num_blocks(e.worker_id),
                "index_digest": _digest(service.index.blocks(e.worker_id)),
                "events_applied": e.events_applied,
                "snapshots": e.snapshots,
            }
        return {"workers": out, "index": service.index.stats()}

    @api.get("/admin/workers", dependencies=[Depends(require_admin)])
    async def list_workers():
        return {
            "workers": [
                {
                    "worker_id": e.worker_id,
                    "healthy": e.healthy,
                    "draining": e.draining,
                    "inflight": len(e.inflight),
                    "info": e.info,
                }
                for e in service.pool.workers.values()
            ]
        }

    @api.post("/admin/workers", dependencies=[Depends(require_admin)], status_code=201)
    async def add_worker(body: AddWorker):
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

    @api.delete(
        "/admin/workers/{worker_id}", dependencies=[Depends(require_admin)], status_code=202
    )
    async def remove_worker(worker_id: str):
        if worker_id not in service.pool.workers:
            raise ApiError(404, f"no worker {worker_id!r}", param="worker_id")
        service.start_drain(worker_id)
        return {"worker_id": worker_id, "status": "draining"}

    return api
