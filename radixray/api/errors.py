"""HTTP errors in OpenAI's shape, raised at the edge only: the one place an error body is built
and the one map from a request's error kind (``radixray.protocol.ErrorKind``) to a status."""

from __future__ import annotations

import json

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixray.protocol import ErrorKind, RequestError

__all__ = ["ApiError", "api_error", "error_body", "error_response", "install_error_handlers"]

# kind -> (status, OpenAI error type, code). A worker that is gone and a router with no worker
# left are both 503 (retry soon); an engine that failed on every worker tried is a 500.
_BY_KIND: dict[ErrorKind, tuple[int, str, str | None]] = {
    ErrorKind.INVALID_REQUEST: (400, "invalid_request_error", None),
    ErrorKind.ENGINE_FAILURE: (500, "server_error", "engine_failed"),
    ErrorKind.WORKER_UNAVAILABLE: (503, "service_unavailable", "no_worker"),
    ErrorKind.OVERLOADED: (429, "rate_limit_error", "overloaded"),
    ErrorKind.ABORTED: (499, "invalid_request_error", "aborted"),
}


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(status: int, message: str, type_: str, code: str | None = None) -> tuple:
    """``(status, headers, body bytes)`` of an error answered outside FastAPI (plain ASGI)."""
    body = json.dumps(error_body(message, type_, None, code)).encode()
    return status, [(b"content-type", b"application/json")], body


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers


def api_error(e: RequestError, retry_after_s: int = 1) -> ApiError:
    """The HTTP error for a failed request, by its kind."""
    status, type_, code = _BY_KIND[e.kind]
    retry = status in (429, 503)
    return ApiError(
        status,
        e.message,
        type_,
        e.param,
        code,
        {"Retry-After": str(retry_after_s)} if retry else None,
    )


def _param(loc) -> str | None:
    """["body", "messages", 0, "role"] -> "messages[0].role"."""
    parts = [p for p in loc if p != "body"]
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif p in ("str", "list[int]", "list[str]", "function-after[_prompt(), union]"):
            continue  # pydantic's union-branch labels are not parameters
        else:
            out += ("." if out else "") + str(p)
    return out or None


def install_error_handlers(app) -> None:
    @app.exception_handler(RequestError)
    async def _request_error(request: Request, exc: RequestError):
        return await _api_error(request, api_error(exc))

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return JSONResponse(
            error_body(exc.message, exc.type, exc.param, exc.code),
            status_code=exc.status,
            headers=exc.headers,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        # Unknown routes, wrong methods: still OpenAI's error shape.
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(
            error_body(str(exc.detail), kind, None, None),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        errs = exc.errors()
        first = errs[0] if errs else {}
        loc = first.get("loc", ())
        if first.get("type") == "json_invalid":
            return JSONResponse(
                error_body(
                    f"the request body is not valid JSON: {first.get('msg')}",
                    "invalid_request_error",
                    None,
                    "invalid_json",
                ),
                status_code=400,
            )
        param = _param(loc)
        msg = first.get("msg", "invalid request")
        if first.get("type") == "extra_forbidden":
            msg = f"Unrecognized request argument supplied: {param}"
        elif first.get("type") == "missing":
            msg = f"Missing required parameter: {param}"
        else:
            msg = f"Invalid value for {param}: {msg}"
        return JSONResponse(
            error_body(msg, "invalid_request_error", param, first.get("type")), status_code=400
        )
