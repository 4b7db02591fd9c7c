"""Builds the router's FastAPI app: the OpenAI edge (``radixray.api``) served from the
``RouterService``, and the operations routes (``routes_ops.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI

from radixray.api import BodyLimit, CountRequests, OpenAIApp, ResponseStore, install_openai

from .routes_ops import ops_router
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

    app = OpenAIApp(title="radixray router", version="0.1.0", lifespan=lifespan)
    app.state.service = service
    install_openai(app, service, ResponseStore(service.router_id, service.settings.responses))
    app.include_router(ops_router)
    # The last added runs first: CountRequests also counts the body limit's refusals.
    app.add_middleware(BodyLimit, limit=service.settings.max_body_bytes)
    app.add_middleware(CountRequests, counter=service.metrics.requests)
    return app
