"""HTTP errors in OpenAI's shape, raised at the edge only: the one place an error body is built
and the one map from a request's error kind (``radixray.protocol.ErrorKind``) to a status."""

from __future__ import annotations

import logging
import re

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixray.protocol import ErrorKind, RequestError

__all__ = [
    "ApiError",
    "api_error",
    "error_body",
    "error_response",
    "install_error_handlers",
]

log = logging.getLogger(__name__)

# kind -> (status, OpenAI error type, code). A worker that is gone and a router with no worker
# left are both 503 (retry soon); an engine that failed on every worker tried is a 500.
_BY_KIND: dict[ErrorKind, tuple[int, str, str | None]] = {
    ErrorKind.INVALID_REQUEST: (400, "invalid_request_error", None),
    ErrorKind.ENGINE_FAILURE: (500, "server_error", "engine_failed"),
    ErrorKind.WORKER_UNAVAILABLE: (503, "service_unavailable", "no_worker"),
    ErrorKind.OVERLOADED: (429, "rate_limit_error", "overloaded"),
    ErrorKind.ABORTED: (499, "invalid_request_error", "aborted"),
}


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


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def api_error(e: RequestError, retry_after_s: int = 1) -> ApiError:
    """The HTTP error for a failed request, by its kind; a 429 or 503 says when to retry: the
    error's own ``retry_after_s`` where it knows one (``Overloaded`` by queueing delay), else
    ``retry_after_s``."""
    status, type_, code = _BY_KIND[e.kind]
    after = getattr(e, "retry_after_s", None) or retry_after_s
    headers = {"Retry-After": str(after)} if status in (429, 503) else None
    return ApiError(status, e.message, type_, e.param, code, headers)


# pydantic's labels of union branches and validator functions in an error's location
# ("list[int]", "function-before[_prompt(), union[...]]"); parameters never look like this.
_LABEL = re.compile(r"^(str|int|[\w-]+\[.*\])$")


def _param(loc) -> str | None:
    """["body", "messages", 0, "role"] -> "messages[0].role"; ["query", "limit"] -> "limit"."""
    parts = list(loc[1:] if loc and loc[0] in ("body", "query", "path") else loc)
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif _LABEL.match(str(p)):
            continue  # pydantic's union-branch labels are not parameters
        else:
            out += ("." if out else "") + str(p)
    return out or None


def _validation_error(exc: RequestValidationError) -> ApiError:
    errs = exc.errors()
    first = errs[0] if errs else {}
    if first.get("type") == "json_invalid":
        msg = f"the request body is not valid JSON: {first.get('msg')}"
        return ApiError(400, msg, code="invalid_json")
    ctx = first.get("ctx") or {}
    if "param" in ctx:  # a schema's own check that names the parameter (an element of a list)
        return ApiError(
            400, first.get("msg", "invalid request"), param=ctx["param"], code=first.get("type")
        )
    param = _param(first.get("loc", ()))
    msg = first.get("msg", "invalid request")
    if first.get("type") == "extra_forbidden":
        msg = f"Unrecognized request argument supplied: {param}"
    elif first.get("type") == "missing":
        msg = f"Missing required parameter: {param}"
    else:
        msg = f"Invalid value for {param}: {msg}"
    return ApiError(400, msg, param=param, code=first.get("type"))


def error_response(exc: Exception) -> JSONResponse:
    """The OpenAI-shaped answer to anything a route raised (an unexpected exception is logged
    and answered 500: a bug, never the client's fault)."""
    if isinstance(exc, RequestError):
        exc = api_error(exc)
    elif isinstance(exc, RequestValidationError):
        exc = _validation_error(exc)
    elif isinstance(exc, StarletteHTTPException):
        # Unknown routes, wrong methods: still OpenAI's error shape.
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        exc = ApiError(exc.status_code, str(exc.detail), kind, headers=exc.headers)
    elif not isinstance(exc, ApiError):
        log.error("unexpected error serving a request", exc_info=exc)
        exc = ApiError(500, f"internal error: {type(exc).__name__}", "server_error")
    return JSONResponse(
        error_body(exc.message, exc.type, exc.param, exc.code),
        status_code=exc.status,
        headers=exc.headers,
    )


async def _handle(request: Request, exc: Exception) -> JSONResponse:
    return error_response(exc)


def install_error_handlers(app) -> None:
    for kind in (RequestError, ApiError, StarletteHTTPException, RequestValidationError):
        app.add_exception_handler(kind, _handle)
