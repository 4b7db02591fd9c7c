"""``OpenAIApp``: a FastAPI app whose OpenAI POST routes skip FastAPI's own layers.

Every request to /v1/completions and /v1/chat/completions is the router's hot path. Through
FastAPI's whole stack (its error and telemetry middleware, route matching, dependency solving,
the exit-stack middleware) the edge cost ~180 us a request on this machine's CPU; the same
handlers called directly, inside the same user middleware (body limit, request counter), cost
~70 us (benchmarks/README.md, "Router process cost"). The handlers, their error answers
(``error_response``) and their OpenAPI description are the app's own; only the dispatch is
different. Every other path goes through FastAPI unchanged.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.requests import Request

from .errors import error_response
from .openai_routes import REQUEST_MODELS

__all__ = ["OpenAIApp"]


class OpenAIApp(FastAPI):
    _hot = None

    async def __call__(self, scope, receive, send):
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"] in REQUEST_MODELS
        ):
            if self._hot is None:
                hot = _HotRoutes()
                for cls, args, kwargs in reversed(self.user_middleware):
                    hot = cls(hot, *args, **kwargs)
                self._hot = hot
            scope["app"] = self
            if self.root_path:
                scope["root_path"] = self.root_path
            await self._hot(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


class _HotRoutes:
    """Calls a hot route's serve function with the request and its body."""

    def __init__(self):
        self._routes: dict | None = None  # path -> the app's route (for the request counter)

    async def __call__(self, scope, receive, send):
        if self._routes is None:
            routes = scope["app"].router.routes
            self._routes = {r.path: r for r in routes if getattr(r, "path", None) in REQUEST_MODELS}
        scope["route"] = self._routes.get(scope["path"])
        serve = REQUEST_MODELS[scope["path"]][0]
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before sending its body
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        try:
            response = await serve(Request(scope, receive), bytes(body))
        except Exception as e:  # the app's own error answers, as FastAPI would give them
            response = error_response(e)
        await response(scope, receive, send)
