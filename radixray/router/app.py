"""Builds the router's FastAPI app; routes live in routes_openai.py and routes_ops.py."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request

from .errors import install_error_handlers
from .openai_api import error_body
from .routes_openai import openai_routes
from .routes_ops import ops_routes
from .service import RouterService

__all__ = ["build_app"]


def build_app(
    service: RouterService, manage_lifecycle: bool = True, on_startup: Sequence = ()
) -> FastAPI:
    """The HTTP app around ``service``. With ``manage_lifecycle`` the app starts the worker
    feed on startup and stops it on shutdown. ``on_startup``: coroutine functions awaited
    first (e.g. start and register the workers)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        for fn in on_startup:
            await fn()
        if manage_lifecycle:
            await service.start()
        yield
        if manage_lifecycle:
            await service.stop()

    app = FastAPI(title="radixray router", version="0.1.0", lifespan=lifespan)
    app.state.service = service
    install_error_handlers(app)
    limit = service.settings.max_body_bytes

    @app.middleware("http")
    async def body_limit(request: Request, call_next):
        length = request.headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                return _error(400, "invalid Content-Length header", None)
            if int(length) > limit:
                return _error(413, f"request body is {length} bytes; the limit is {limit}", None)
        elif request.method in ("POST", "PUT", "PATCH"):
            body = await request.body()  # chunked upload: count what actually arrived
            if len(body) > limit:
                return _error(413, f"request body exceeds the {limit}-byte limit", None)
        return await call_next(request)

    @app.middleware("http")
    async def count_requests(request: Request, call_next):
        response = await call_next(request)
        route = request.scope.get("route")
        path = getattr(route, "path", "unmatched")
        service.metrics.requests.labels(path, str(response.status_code)).inc()
        return response

    app.include_router(openai_routes(service))
    app.include_router(ops_routes(service))
    return app


def _error(status: int, message: str, param: str | None):
    from fastapi.responses import JSONResponse

    return JSONResponse(error_body(message, "invalid_request_error", param), status_code=status)
