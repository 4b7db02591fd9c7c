"""OpenAI-compatible routes: /v1/completions, /v1/chat/completions, /v1/models."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from . import openai_api as oa
from .errors import ApiError
from .router import NoWorkerAvailable, RequestFailed, RoutedStream
from .service import Overloaded, RouterService

__all__ = ["openai_routes"]

# Tokenizing a long prompt takes milliseconds: past this many characters it runs in a thread
# so the event loop keeps serving other requests.
_INLINE_TOKENIZE_CHARS = 4096


def openai_routes(service: RouterService) -> APIRouter:
    api = APIRouter()
    meta = service.meta

    async def encode(text: str) -> list[int]:
        if len(text) <= _INLINE_TOKENIZE_CHARS:
            return meta.tokenizer.encode(text)
        return await asyncio.to_thread(meta.tokenizer.encode, text)

    def check_model(model: str) -> None:
        if model != meta.name:
            raise ApiError(
                404,
                f"The model `{model}` does not exist; this server serves `{meta.name}`",
                "invalid_request_error",
                "model",
                "model_not_found",
            )

    def check_lengths(prompt_ids: list[int], max_tokens: int | None, param: str) -> int:
        limit = meta.max_model_len
        if len(prompt_ids) >= limit:
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens; the "
                f"prompt has {len(prompt_ids)}",
                param=param,
                code="context_length_exceeded",
            )
        room = limit - len(prompt_ids)
        cap = service.settings.max_tokens_limit
        if max_tokens is None:
            return min(room, cap)
        if max_tokens > cap:
            raise ApiError(
                400,
                f"max_tokens is {max_tokens}; this server allows at most {cap}",
                param="max_tokens",
                code="max_tokens_too_large",
            )
        if max_tokens > room:
            raise ApiError(
                400,
                f"max_tokens is {max_tokens} but only {room} tokens fit after "
                f"the {len(prompt_ids)}-token prompt (context length {limit})",
                param="max_tokens",
                code="context_length_exceeded",
            )
        return max_tokens

    def params_of(req: oa._Sampling, max_tokens: int) -> dict:
        return {
            "max_tokens": max_tokens,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "seed": req.seed,
            "stop": tuple(req.stop or ()),
            "ignore_eos": req.ignore_eos,
        }

    async def open_stream(prompt_ids: list[int], params: dict, user: str | None) -> RoutedStream:
        try:
            service.admit()
        except Overloaded as e:
            raise ApiError(
                429,
                f"The server is overloaded: {e}; retry later",
                "rate_limit_error",
                code="overloaded",
                headers={"Retry-After": str(service.settings.retry_after_s)},
            ) from None
        try:
            return await service.router.open(prompt_ids, params, session_key=user)
        except NoWorkerAvailable as e:
            service.release()
            raise ApiError(
                503,
                f"No worker is available: {e}",
                "service_unavailable",
                code="no_worker",
                headers={"Retry-After": "1"},
            ) from None
        except RequestFailed as e:
            service.release()
            raise ApiError(500, str(e), "server_error", code="engine_failed") from None
        except ValueError as e:
            service.release()
            raise ApiError(400, str(e)) from None
        except BaseException:
            service.release()
            raise

    def headers_of(stream: RoutedStream) -> dict:
        return {
            "x-radixray-worker": str(stream.worker_id),
            "x-radixray-cached-tokens": str(stream.cached_tokens),
        }

    async def collect(request: Request, stream: RoutedStream) -> tuple[str, dict]:
        """Run a stream to its end; abort it if the client goes away meanwhile."""
        parts: list[str] = []

        async def drain():
            async for c in stream:
                parts.append(c.get("text") or "")
                if c.get("finish_reason"):
                    return c
            return {"finish_reason": "error", "error": "stream ended without a final chunk"}

        task = asyncio.ensure_future(drain())
        try:
            while not task.done():
                done, _ = await asyncio.wait({task}, timeout=0.25)
                if not done and await request.is_disconnected():
                    task.cancel()
                    await stream.aclose()
                    raise ApiError(499, "client disconnected")
            final = task.result()
        finally:
            if not task.done():
                task.cancel()
            service.release()
        if final.get("finish_reason") == "error":
            raise ApiError(
                502, final.get("error") or "worker failed", "server_error", code="worker_failed"
            )
        return "".join(parts), final

    def usage_of(final: dict) -> dict:
        return oa.usage(
            final.get("prompt_tokens", 0),
            final.get("completion_tokens", 0),
            final.get("cached_tokens", 0),
        )

    async def sse(
        stream: RoutedStream, make_chunk, first_extra=None, include_usage=False
    ) -> AsyncIterator[bytes]:
        try:
            if first_extra is not None:
                yield _sse(first_extra)
            async for c in stream:
                reason = c.get("finish_reason")
                if reason == "error":
                    err = oa.error_body(
                        c.get("error") or "worker failed", "server_error", code="worker_failed"
                    )
                    yield _sse(err)
                    break
                text = c.get("text") or ""
                if text or reason:
                    yield _sse(make_chunk(text, reason if reason else None))
                if reason:
                    if include_usage:
                        yield _sse(make_chunk(None, None, usage_of(c)))
                    break
            yield b"data: [DONE]\n\n"
        finally:
            # Runs on normal end and when the client disconnects (the generator is closed).
            await stream.aclose()
            service.release()

    @api.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [{"id": meta.name, "object": "model", "created": 0, "owned_by": "radixray"}],
        }

    @api.post("/v1/completions")
    async def completions(body: oa.CompletionRequest, request: Request):
        check_model(body.model)
        if isinstance(body.prompt, str):
            prompt_ids = await encode(body.prompt)
            param = "prompt"
        else:
            prompt_ids = list(body.prompt)
            param = "prompt"
            bad = next((t for t in prompt_ids if not 0 <= t < meta.vocab_size), None)
            if bad is not None:
                raise ApiError(
                    400,
                    f"token id {bad} is outside the vocabulary [0, {meta.vocab_size})",
                    param="prompt",
                )
        if not prompt_ids:
            raise ApiError(400, "prompt must not be empty", param="prompt")
        max_tokens = check_lengths(prompt_ids, body.max_tokens, param)
        stream = await open_stream(prompt_ids, params_of(body, max_tokens), body.user)
        rid = f"cmpl-{uuid.uuid4().hex}"
        if body.stream:

            def make(text, reason, use=None):
                if text is None:
                    c = oa.completion_chunk(rid, meta.name, "", None, use)
                    c["choices"] = []
                    return c
                return oa.completion_chunk(rid, meta.name, text, reason)

            return StreamingResponse(
                sse(stream, make, include_usage=body.include_usage),
                media_type="text/event-stream",
                headers=headers_of(stream),
            )
        text, final = await collect(request, stream)
        return JSONResponse(
            oa.completion_response(rid, meta.name, text, final["finish_reason"], usage_of(final)),
            headers=headers_of(stream)
            | {"x-radixray-cached-tokens": str(final.get("cached_tokens", 0))},
        )

    @api.post("/v1/chat/completions")
    async def chat(body: oa.ChatCompletionRequest, request: Request):
        check_model(body.model)
        try:
            text = meta.tokenizer.apply_chat_template(
                body.plain_messages(), add_generation_prompt=True
            )
        except ValueError as e:
            raise ApiError(400, f"messages cannot be rendered: {e}", param="messages") from None
        prompt_ids = await encode(text)
        max_tokens = check_lengths(prompt_ids, body.token_limit, "messages")
        stream = await open_stream(prompt_ids, params_of(body, max_tokens), body.user)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        if body.stream:

            def make(text, reason, use=None):
                if text is None:
                    return oa.chat_chunk(rid, meta.name, {}, None, use, with_choice=False)
                return oa.chat_chunk(rid, meta.name, {"content": text} if text else {}, reason)

            first = oa.chat_chunk(rid, meta.name, {"role": "assistant", "content": ""}, None)
            return StreamingResponse(
                sse(stream, make, first_extra=first, include_usage=body.include_usage),
                media_type="text/event-stream",
                headers=headers_of(stream),
            )
        text, final = await collect(request, stream)
        return JSONResponse(
            oa.chat_response(rid, meta.name, text, final["finish_reason"], usage_of(final)),
            headers=headers_of(stream)
            | {"x-radixray-cached-tokens": str(final.get("cached_tokens", 0))},
        )

    return api


def _sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
