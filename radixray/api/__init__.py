"""The OpenAI-compatible HTTP edge, shared by the router and by a worker served on its own.

``install_openai(app, backend)`` adds /v1/completions, /v1/chat/completions, /v1/responses (and
its stored responses), /v1/models, /tokenizer_info and vLLM's /tokenize and /detokenize to an
``OpenAIApp`` (a FastAPI app), served from ``backend`` (the router, or one worker's engine),
with OpenAI-shaped errors. Torch-free.
"""

from __future__ import annotations

import time

from .backend import Backend, TokenStream
from .errors import ApiError, api_error, error_body, install_error_handlers
from .front import OpenAIApp
from .middleware import BodyLimit, CountRequests
from .openai_routes import openai_router
from .response_store import ResponseStore, ResponseStoreConfig
from .responses_api import responses_router

__all__ = [
    "ApiError",
    "Backend",
    "BodyLimit",
    "CountRequests",
    "OpenAIApp",
    "ResponseStore",
    "ResponseStoreConfig",
    "TokenStream",
    "api_error",
    "error_body",
    "install_openai",
]


def install_openai(
    app: OpenAIApp, backend: Backend, responses: ResponseStore | None = None
) -> None:
    """The OpenAI routes and error handlers on ``app``, served from ``backend``; stored
    responses (``/v1/responses``) kept in ``responses`` (default: a store of the default size
    named after the served model)."""
    if not isinstance(app, OpenAIApp):
        raise TypeError(f"install_openai needs an OpenAIApp, got {type(app).__name__}")
    app.state.backend = backend
    app.state.created = int(time.time())  # the served model's "created" in /v1/models
    app.state.responses = ResponseStore(backend.meta.name) if responses is None else responses
    install_error_handlers(app)
    app.include_router(openai_router)
    app.include_router(responses_router)
