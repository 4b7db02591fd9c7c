"""Pure ASGI middleware (not Starlette's BaseHTTPMiddleware, which wraps ``receive`` and breaks
``request.is_disconnected()``: the router must see clients go away to abort their requests)."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from .errors import error_body

__all__ = ["BodyLimit", "CountRequests", "replay_body"]


def replay_body(data: bytes, receive):
    """A ``receive`` that hands the app an already-read body once, then the real channel (a
    disconnect must still reach the app)."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": data, "more_body": False}
        return await receive()

    return replay


def _reject(status: int, message: str) -> JSONResponse:
    return JSONResponse(error_body(message, "invalid_request_error"), status_code=status)


class BodyLimit:
    """Refuse bodies over ``limit`` bytes: by Content-Length up front, or, for a chunked upload,
    by counting what arrives (buffered up to the limit, then replayed to the app)."""

    def __init__(self, app, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            if not length.isdigit():
                return await _reject(400, "invalid Content-Length header")(scope, receive, send)
            if int(length) > self.limit:
                msg = f"request body is {int(length)} bytes; the limit is {self.limit}"
                return await _reject(413, msg)(scope, receive, send)
            return await self.app(scope, receive, send)
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":
                return  # the client left before sending its body
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                text = f"request body exceeds the {self.limit}-byte limit"
                return await _reject(413, text)(scope, receive, send)
            if not msg.get("more_body"):
                break
        return await self.app(scope, replay_body(b"".join(chunks), receive), send)


class CountRequests:
    """Count responses by route template and status into the router's metrics."""

    def __init__(self, app, counter):
        self.app = app
        self.counter = counter

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
            route = scope.get("route")
            self.counter.labels(getattr(route, "path", "unmatched"), str(status["code"])).inc()
