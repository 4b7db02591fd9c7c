"""Builds the router's FastAPI app; routes live in routes_openai.py and routes_ops.py."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI

from .errors import install_error_handlers
from .middleware import BodyLimit, CountRequests
from .routes_openai import openai_routes
from .routes_ops import ops_routes
from .routes_sglang import install_sglang_routes
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
    # The last added runs first: CountRequests also counts the body limit's refusals.
    app.add_middleware(BodyLimit, limit=service.settings.max_body_bytes)
    app.add_middleware(CountRequests, counter=service.metrics.requests)

    app.include_router(openai_routes(service))
    app.include_router(ops_routes(service))
    install_sglang_routes(app, service)  # SGLang-router probes, /internal/* for HttpWorkerClient
    return app
