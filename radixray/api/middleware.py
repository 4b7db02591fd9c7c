"""Pure ASGI middleware (not Starlette's BaseHTTPMiddleware, which wraps ``receive`` and breaks
``request.is_disconnected()``: the router must see clients go away to abort their requests)."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from .body import BodyTooLarge, declared_length, discard_body, read_body, replay_body
from .errors import error_body

__all__ = ["BodyLimit", "CountRequests", "replay_body"]


def _reject(status: int, message: str) -> JSONResponse:
    return JSONResponse(error_body(message, "invalid_request_error"), status_code=status)


class BodyLimit:
    """Refuse bodies over ``limit`` bytes with a 413 naming the limit: by Content-Length up
    front, or, for a chunked upload, by counting what arrives (buffered up to the limit, then
    replayed to the app). Either way the body is read to its end (up to a cap, ``body.py``)
    before the answer, so that the client receives it."""

    def __init__(self, app, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        try:
            length = declared_length(scope)
        except ValueError:
            return await _reject(400, "invalid Content-Length header")(scope, receive, send)
        if length is not None:
            if length > self.limit:
                await discard_body(receive)
                msg = BodyTooLarge(self.limit, length).message
                return await _reject(413, msg)(scope, receive, send)
            return await self.app(scope, receive, send)
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        try:
            body = await read_body(receive, self.limit)
        except BodyTooLarge as e:
            return await _reject(413, e.message)(scope, receive, send)
        if body is None:
            return  # the client left before sending its body
        return await self.app(scope, replay_body(body, receive), send)


class CountRequests:
    """Count responses by route template and status into the router's metrics. Each (route,
    status) child is looked up once and kept: ``counter.labels`` checks and joins its labels
    under a lock on every call (~1 us a request)."""

    def __init__(self, app, counter):
        self.app = app
        self.counter = counter
        self._children: dict[tuple[str, int], object] = {}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = {"code": 500}

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            key = (getattr(scope.get("route"), "path", "unmatched"), status["code"])
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = self.counter.labels(key[0], str(key[1]))
            child.inc()
