"""The OpenAI-compatible HTTP edge, shared by the router and by a worker served on its own.

``install_openai(app, backend)`` adds /v1/completions, /v1/chat/completions and /v1/models to a
FastAPI app, served from ``backend`` (the router, or one worker's engine), with OpenAI-shaped
errors. Torch-free.
"""

from __future__ import annotations

from fastapi import FastAPI

from .backend import Backend, TokenStream
from .errors import ApiError, api_error, error_body, install_error_handlers
from .middleware import BodyLimit, CountRequests
from .openai_routes import openai_router

__all__ = [
    "ApiError",
    "Backend",
    "BodyLimit",
    "CountRequests",
    "TokenStream",
    "api_error",
    "error_body",
    "install_openai",
]


def install_openai(app: FastAPI, backend: Backend) -> None:
    app.state.backend = backend
    install_error_handlers(app)
    app.include_router(openai_router)
