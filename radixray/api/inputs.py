"""What every route does with its input before it serves: find the backend, validate the body
against its schema, check the model's name, render a chat, tokenize (in a thread when long), and
turn a ``radixray.protocol.rules`` check into a 400 naming the field."""

from __future__ import annotations

import asyncio

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from radixray.protocol import InvalidRequest

from .backend import Backend
from .errors import ApiError

__all__ = [
    "INLINE_TOKENIZE_CHARS",
    "backend_of",
    "check_model",
    "client_error",
    "encode",
    "parse_body",
    "render_chat",
]

# Tokenizing a long prompt takes milliseconds: past this many characters it runs in a thread
# so the event loop keeps serving other requests.
INLINE_TOKENIZE_CHARS = 4096


def backend_of(request: Request) -> Backend:
    return request.app.state.backend


def parse_body(raw: bytes, model: type[BaseModel]):
    """``raw`` validated against ``model`` (pydantic, in Rust); an invalid body raises what
    FastAPI would, so the error handlers answer it as a 400 naming the field."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        raise RequestValidationError(e.errors(include_url=False)) from None


def check_model(backend: Backend, model: str) -> None:
    if model != backend.meta.name:
        raise ApiError(
            404,
            f"The model `{model}` does not exist; this server serves `{backend.meta.name}`",
            "invalid_request_error",
            "model",
            "model_not_found",
        )


def render_chat(
    backend: Backend,
    messages: list[dict],
    add_generation_prompt: bool,
    tools: list[dict] | None = None,
) -> str:
    kw = {"tools": tools} if tools else {}  # a tokenizer without tool support still renders
    try:
        return backend.meta.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, **kw
        )
    except ValueError as e:
        raise ApiError(400, f"messages cannot be rendered: {e}", param="messages") from None


async def encode(backend: Backend, text: str, add_special_tokens: bool = False) -> list[int]:
    tokenizer = backend.meta.tokenizer
    if len(text) <= INLINE_TOKENIZE_CHARS:
        return tokenizer.encode(text, add_special_tokens=add_special_tokens)
    return await asyncio.to_thread(tokenizer.encode, text, add_special_tokens=add_special_tokens)


def client_error(check, *args) -> None:
    """Run a ``radixray.protocol.rules`` check; its InvalidRequest is a 400 naming the field."""
    try:
        check(*args)
    except InvalidRequest as e:
        raise ApiError(400, e.message, param=e.param) from None
