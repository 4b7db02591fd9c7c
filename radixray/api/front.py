"""``EdgeFront``: the OpenAI POST routes without FastAPI's routing and dependency layers.

Every request to /v1/completions and /v1/chat/completions is the router's hot path. Served
through FastAPI (route matching, dependency solving, its exception and exit-stack middleware)
the edge cost ~180 us a request on this machine's CPU; calling the same handlers directly costs
~70 us (benchmarks/README.md, "Router process cost"). The handlers, their errors (answered by
the same ``error_response``) and their OpenAPI description are the FastAPI app's own: only the
dispatch is skipped. Every other path goes through FastAPI unchanged.

Installed as the innermost user middleware, so the body limit and the request counter (outer
middleware) still see every request.
"""

from __future__ import annotations

from starlette.requests import Request

from .errors import error_response
from .openai_routes import REQUEST_MODELS

__all__ = ["EdgeFront"]


class EdgeFront:
    def __init__(self, app):
        self.app = app
        self._routes: dict | None = None  # path -> the app's route (for its counter label)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST":
            entry = REQUEST_MODELS.get(scope["path"])
            if entry is not None:
                await self._serve(entry[0], scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _serve(self, handler, scope, receive, send) -> None:
        if self._routes is None:
            routes = scope["app"].router.routes
            self._routes = {r.path: r for r in routes if getattr(r, "path", None) in REQUEST_MODELS}
        scope["route"] = self._routes.get(scope["path"])
        request = Request(scope, receive)
        try:
            response = await handler(request)
        except Exception as e:  # the app's own error answers, as FastAPI would give them
            response = error_response(e)
        await response(scope, receive, send)
