"""``OpenAIApp``: a FastAPI app whose OpenAI POST routes skip FastAPI's own layers.

Every request to /v1/completions and /v1/chat/completions is the router's hot path. Through
FastAPI's whole stack (its error and telemetry middleware, route matching, dependency solving,
the exit-stack middleware) the edge cost ~180 us a request on this machine's CPU; the same
handlers called directly, inside the same user middleware (body limit, request counter), cost
~70 us (benchmarks/README.md, "Router process cost"). So these two routes are not FastAPI
routes at all: each is one ``PostRoute`` (``openai_routes.REQUEST_MODELS``), served here and
described in the app's OpenAPI document from the same request schema. Every other path goes
through FastAPI unchanged.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.exceptions import HTTPException
from starlette.requests import Request

from .body import read_body
from .errors import error_response
from .openai_routes import REQUEST_MODELS, PostRoute

__all__ = ["OpenAIApp"]


class OpenAIApp(FastAPI):
    _hot = None

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] in REQUEST_MODELS:
            if self._hot is None:
                hot = _serve_post_route
                for cls, args, kwargs in reversed(self.user_middleware):
                    hot = cls(hot, *args, **kwargs)
                self._hot = hot
            scope["app"] = self
            scope["route"] = REQUEST_MODELS[scope["path"]]  # labels the request counter
            if self.root_path:
                scope["root_path"] = self.root_path
            await self._hot(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    def openapi(self) -> dict:
        """FastAPI's description of its own routes, plus the POST routes served here, each
        with the request schema its handler validates against."""
        if self.openapi_schema is None:
            schema = get_openapi(title=self.title, version=self.version, routes=self.routes)
            paths = schema.setdefault("paths", {})
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for route in REQUEST_MODELS.values():
                paths[route.path] = {"post": _operation(route)}
                s = route.model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(s.pop("$defs", {}))
                components[route.model.__name__] = s
            self.openapi_schema = schema
        return self.openapi_schema


async def _serve_post_route(scope, receive, send) -> None:
    """Calls a POST route's serve function with the request and its body (inside the app's
    middleware: the body limit has already refused an oversized body)."""
    route = REQUEST_MODELS[scope["path"]]
    if scope["method"] != "POST":
        response = error_response(HTTPException(405, headers={"Allow": "POST"}))
        await response(scope, receive, send)
        return
    body = await read_body(receive)
    if body is None:
        return  # the client left before sending its body
    try:
        response = await route.serve(Request(scope, receive), body)
    except Exception as e:  # the app's own error answers, as FastAPI would give them
        response = error_response(e)
    await response(scope, receive, send)


def _operation(route: PostRoute) -> dict:
    """The OpenAPI operation of a POST route (what FastAPI would write for it)."""
    ref = {"$ref": f"#/components/schemas/{route.model.__name__}"}
    any_json = {"application/json": {"schema": {}}}
    return {
        "summary": route.name.replace("_", " ").title(),
        "operationId": f"{route.name}{route.path}_post".replace("/", "_"),
        "requestBody": {"content": {"application/json": {"schema": ref}}, "required": True},
        "responses": {"200": {"description": "Successful Response", "content": any_json}},
    }
