"""OpenAI-compatible routes: /v1/completions, /v1/chat/completions, /v1/models.

Module-level handlers over the app's :class:`~radixray.api.backend.Backend` (the router, or one
worker's engine: ``app.state.backend``). Completions and chat differ only in how the prompt is
made (text or token ids; messages through the chat template) and in the shape of the answer;
both go through one serve path: check the lengths, build the ``SamplingParams`` and the
``GenerateRequest`` once, open the stream, answer as SSE or as one JSON body.

The two POST handlers take the bare request and its body and validate it themselves (pydantic,
in Rust): ``OpenAIApp`` (``front.py``) calls them without FastAPI's routing and dependency
layers. ``REQUEST_MODELS`` is their one registration: the app serves and documents (OpenAPI)
each from it.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from json.encoder import encode_basestring_ascii
from typing import NamedTuple

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from radixray.protocol import (
    GenerateRequest,
    InvalidRequest,
    RequestError,
    StreamChunk,
)
from radixray.protocol.rules import check_context, check_token_ids

from . import schemas as oa
from .backend import Backend, TokenStream
from .errors import ApiError, api_error, error_body
from .sampling import sampling_params
from .sse import SSEResponse

__all__ = [
    "PostRoute",
    "REQUEST_MODELS",
    "list_models",
    "openai_router",
    "serve_chat",
    "serve_completions",
]

# Tokenizing a long prompt takes milliseconds: past this many characters it runs in a thread
# so the event loop keeps serving other requests.
_INLINE_TOKENIZE_CHARS = 4096
# How often a non-streaming request checks that its client is still there.
_DISCONNECT_POLL_S = 0.25

openai_router = APIRouter()


def _backend(request: Request) -> Backend:
    return request.app.state.backend


def _parse(raw: bytes, model: type[BaseModel]):
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        raise RequestValidationError(e.errors(include_url=False)) from None


# ---------------------------------------------------------------------- routes


@openai_router.get("/v1/models")
async def list_models(request: Request):
    name = _backend(request).meta.name
    return {
        "object": "list",
        "data": [{"id": name, "object": "model", "created": 0, "owned_by": "radixray"}],
    }


async def serve_completions(request: Request, raw: bytes) -> Response:
    backend = _backend(request)
    body = _parse(raw, oa.CompletionRequest)
    _check_model(backend, body.model)
    if isinstance(body.prompt, str):
        prompt_ids = await _encode(backend, body.prompt)
    else:
        prompt_ids = list(body.prompt)
        _client_error(check_token_ids, prompt_ids, backend.meta.vocab_size, "prompt")
    if not prompt_ids:
        raise ApiError(400, "prompt must not be empty", param="prompt")
    return await _serve(request, backend, body, prompt_ids, _TextAnswer, "prompt")


async def serve_chat(request: Request, raw: bytes) -> Response:
    backend = _backend(request)
    body = _parse(raw, oa.ChatCompletionRequest)
    _check_model(backend, body.model)
    try:
        text = backend.meta.tokenizer.apply_chat_template(
            body.plain_messages(), add_generation_prompt=True
        )
    except ValueError as e:
        raise ApiError(400, f"messages cannot be rendered: {e}", param="messages") from None
    prompt_ids = await _encode(backend, text)
    return await _serve(request, backend, body, prompt_ids, _ChatAnswer, "messages")


class PostRoute(NamedTuple):
    """One OpenAI POST route: served by ``OpenAIApp`` (``front.py``), which calls ``serve``
    with the request and its body, and described in its OpenAPI document from ``model``, the
    schema ``serve`` validates the body against. ``path`` also labels the request counter."""

    path: str
    name: str  # the OpenAPI operation's name
    serve: Callable[[Request, bytes], Awaitable[Response]]
    model: type[BaseModel]


REQUEST_MODELS: dict[str, PostRoute] = {
    r.path: r
    for r in (
        PostRoute("/v1/completions", "completions", serve_completions, oa.CompletionRequest),
        PostRoute("/v1/chat/completions", "chat_completions", serve_chat, oa.ChatCompletionRequest),
    )
}


# ---------------------------------------------------------------------- the serve path


async def _serve(
    request: Request,
    backend: Backend,
    body: oa.CompletionRequest | oa.ChatCompletionRequest,
    prompt_ids: list[int],
    answer_cls: type[_TextAnswer] | type[_ChatAnswer],
    prompt_param: str,
) -> Response:
    max_tokens = _max_tokens(backend, len(prompt_ids), body.token_limit, prompt_param)
    params = sampling_params(body, max_tokens, backend.meta.vocab_size)
    answer = answer_cls(backend.meta.name, prompt_ids if body.return_token_ids else None)
    req = GenerateRequest(answer.id, prompt_ids, params, body.cache_salt)
    try:
        stream = await backend.open(req, body.user)
    except RequestError as e:
        raise api_error(e, backend.retry_after_s) from None
    headers = {
        "x-radixray-worker": str(stream.worker_id),
        "x-radixray-cached-tokens": str(stream.cached_tokens),
    }
    if body.stream:
        return SSEResponse(_sse(stream, answer, body.include_usage), headers)
    text, token_ids, final = await _collect(request, stream)
    headers["x-radixray-cached-tokens"] = str(final.cached_tokens)
    payload = answer.response(text, token_ids, final.finish_reason, _usage(final))
    return JSONResponse(payload, headers=headers)


def _check_model(backend: Backend, model: str) -> None:
    if model != backend.meta.name:
        raise ApiError(
            404,
            f"The model `{model}` does not exist; this server serves `{backend.meta.name}`",
            "invalid_request_error",
            "model",
            "model_not_found",
        )


async def _encode(backend: Backend, text: str) -> list[int]:
    tokenizer = backend.meta.tokenizer
    if len(text) <= _INLINE_TOKENIZE_CHARS:
        return tokenizer.encode(text)
    return await asyncio.to_thread(tokenizer.encode, text)


def _client_error(check, *args) -> None:
    """Run a ``radixray.protocol.rules`` check; its InvalidRequest is a 400 naming the field."""
    try:
        check(*args)
    except InvalidRequest as e:
        raise ApiError(400, e.message, param=e.param) from None


def _max_tokens(backend: Backend, num_prompt: int, requested: int | None, prompt_param: str) -> int:
    """The request's max_tokens, or the room left in the context (at most the server's cap);
    the context-length rule is the workers' own (``check_context``)."""
    limit, cap = backend.meta.max_model_len, backend.max_tokens_limit
    if requested is not None and requested > cap:
        raise ApiError(
            400,
            f"max_tokens is {requested}; this server allows at most {cap}",
            param="max_tokens",
            code="max_tokens_too_large",
        )
    try:
        check_context(num_prompt, requested or 1, limit)
    except InvalidRequest as e:
        param = prompt_param if e.param == "prompt" else e.param
        raise ApiError(400, e.message, param=param, code="context_length_exceeded") from None
    return requested if requested is not None else min(limit - num_prompt, cap)


def _usage(final: StreamChunk) -> dict:
    return oa.usage(final.prompt_tokens, final.completion_tokens, final.cached_tokens)


async def _collect(request: Request, stream: TokenStream) -> tuple[str, list[int], StreamChunk]:
    """Run a stream to its end (its text, its token ids, its final chunk); abort it if the
    client goes away meanwhile."""
    parts: list[str] = []
    token_ids: list[int] = []

    async def drain() -> StreamChunk:
        async for c in stream:
            parts.append(c.text)
            token_ids.extend(c.token_ids)
            if c.final:
                return c
        raise ApiError(502, "the worker ended the stream without a final chunk")

    try:
        if stream.first.final:  # the whole answer is already here: nothing to wait for
            final = await drain()
            return "".join(parts), token_ids, final
        task = asyncio.ensure_future(drain())
        try:
            while not task.done():
                done, _ = await asyncio.wait({task}, timeout=_DISCONNECT_POLL_S)
                if not done and await request.is_disconnected():
                    raise ApiError(499, "client disconnected")
            return "".join(parts), token_ids, task.result()
        finally:
            if not task.done():
                task.cancel()
    except RequestError as e:  # the worker failed after its first token
        raise ApiError(502, e.message, "server_error", code="worker_failed") from None
    finally:
        await stream.aclose()


async def _sse(stream: TokenStream, answer, include_usage: bool) -> AsyncIterator[bytes]:
    try:
        if answer.first is not None:
            yield _event(answer.first)
        try:
            async for c in stream:
                if not c.final:
                    if answer.with_ids:  # every token's id, even one that ends no character
                        yield _event(answer.chunk(c.text, None, c.token_ids))
                    elif c.text:
                        yield answer.text_event(c.text)
                    continue
                yield _event(answer.chunk(c.text, c.finish_reason, c.token_ids))
                if include_usage:
                    yield _event(answer.usage_chunk(_usage(c)))
                break
        except RequestError as e:  # the worker failed after the response started
            yield _event(error_body(e.message, "server_error", code="worker_failed"))
        yield b"data: [DONE]\n\n"
    finally:
        # Runs on normal end and when the client disconnects (the generator is closed).
        await stream.aclose()


def _event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


_SLOT = "\x01radixray-text\x01"


class _Answer:
    """The shape of one answer. A mid-stream text chunk is the one event sent per token: it is
    rendered once with a placeholder (the same builder as every other chunk), and each token's
    text is escaped into it (``text_event``), instead of building and serializing a dict.

    ``prompt_ids`` (``return_token_ids``): the answer carries the prompt's token ids once (in
    its first chunk when streaming) and every chunk its tokens' ids; such chunks are built as
    dicts."""

    first: dict | None = None

    def __init__(self, kind: str, model: str, prompt_ids: list[int] | None = None):
        self.id = f"{kind}-{uuid.uuid4().hex}"
        self.model = model
        self.created = int(time.time())
        self.with_ids = False  # the per-token template (text_event) carries no ids
        self.prompt_ids: list[int] | None = None
        head, tail = _event(self.chunk(_SLOT, None)).split(json.dumps(_SLOT).encode())
        self._head, self._tail = head, tail
        self.with_ids = prompt_ids is not None
        self.prompt_ids = prompt_ids
        self._prompt_sent = False

    def text_event(self, text: str) -> bytes:
        return self._head + encode_basestring_ascii(text).encode() + self._tail

    def _stream_ids(self, token_ids: list[int] | None) -> tuple[list[int] | None, list[int] | None]:
        """A streamed chunk's (prompt ids, token ids): the prompt's only on the first."""
        if not self.with_ids:
            return None, None
        prompt = None if self._prompt_sent else self.prompt_ids
        self._prompt_sent = True
        return prompt, list(token_ids or ())

    def chunk(self, text: str, reason: str | None, token_ids: list[int] | None = None) -> dict:
        raise NotImplementedError


class _TextAnswer(_Answer):
    """The shape of a /v1/completions answer."""

    def __init__(self, model: str, prompt_ids: list[int] | None = None):
        super().__init__("cmpl", model, prompt_ids)

    def chunk(self, text: str, reason: str | None, token_ids: list[int] | None = None) -> dict:
        prompt, ids = self._stream_ids(token_ids)
        return oa.completion_chunk(
            self.id, self.model, text, reason, None, self.created, prompt, ids
        )

    def usage_chunk(self, use: dict) -> dict:
        c = oa.completion_chunk(self.id, self.model, "", None, use, created=self.created)
        c["choices"] = []
        return c

    def response(self, text: str, token_ids: list[int], reason: str, use: dict) -> dict:
        ids = token_ids if self.with_ids else None
        return oa.completion_response(self.id, self.model, text, reason, use, self.prompt_ids, ids)


class _ChatAnswer(_Answer):
    """The shape of a /v1/chat/completions answer (a first chunk names the role)."""

    def __init__(self, model: str, prompt_ids: list[int] | None = None):
        super().__init__("chatcmpl", model, prompt_ids)
        prompt, ids = self._stream_ids(None)  # the role chunk carries the prompt's ids
        self.first = oa.chat_chunk(
            self.id,
            model,
            {"role": "assistant", "content": ""},
            None,
            created=self.created,
            prompt_token_ids=prompt,
            token_ids=ids,
        )

    def chunk(self, text: str, reason: str | None, token_ids: list[int] | None = None) -> dict:
        delta = {"content": text} if text else {}
        _, ids = self._stream_ids(token_ids)
        return oa.chat_chunk(
            self.id, self.model, delta, reason, created=self.created, token_ids=ids
        )

    def usage_chunk(self, use: dict) -> dict:
        return oa.chat_chunk(
            self.id, self.model, {}, None, use, with_choice=False, created=self.created
        )

    def response(self, text: str, token_ids: list[int], reason: str, use: dict) -> dict:
        ids = token_ids if self.with_ids else None
        return oa.chat_response(self.id, self.model, text, reason, use, self.prompt_ids, ids)
