"""HTTP errors in OpenAI's shape, raised at the edge only."""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .openai_api import error_body

__all__ = ["ApiError", "install_error_handlers"]


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
