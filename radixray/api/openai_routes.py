"""OpenAI-compatible routes: /v1/completions and /v1/chat/completions, and the registration of
every POST route (with /v1/responses, ``responses_api.py``, and vLLM's /tokenize and
/detokenize, ``discovery.py``).

Module-level handlers over the app's :class:`~radixray.api.backend.Backend` (the router, or one
worker's engine: ``app.state.backend``). Completions and chat differ only in how the prompts are
made (text or token ids, one or a list; messages through the chat template) and in the shape of
the answer (``answers.py``); both go through one serve path: check the lengths, build the
``SamplingParams`` once and a ``GenerateRequest`` per prompt, open the streams (``streams.py``),
answer as SSE or as one JSON body.

The POST handlers take the bare request and its body and validate it themselves (pydantic,
in Rust): ``OpenAIApp`` (``front.py``) calls them without FastAPI's routing and dependency
layers. ``REQUEST_MODELS`` is their one registration: the app serves and documents (OpenAPI)
each from it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import NamedTuple

import msgspec
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from radixray.protocol import GrammarSpec
from radixray.protocol.rules import check_token_ids

from . import schemas as oa
from .answers import ChatAnswer, TextAnswer
from .backend import Backend
from .discovery import (
    DetokenizeRequest,
    TokenizeRequest,
    discovery_router,
    list_models,
    serve_detokenize,
    serve_tokenize,
)
from .errors import ApiError
from .inputs import backend_of, check_model, client_error, encode, parse_body
from .logprobs import LogprobFormatter
from .responses_api import ResponsesRequest, serve_responses
from .serve_path import chat_prompt, open_prompts, plan_prompts
from .sse import SSEResponse
from .streams import collect, sse_events, usage_of

__all__ = [
    "PostRoute",
    "REQUEST_MODELS",
    "json_answer",
    "list_models",
    "openai_router",
    "serve_chat",
    "serve_completions",
    "serve_detokenize",
    "serve_tokenize",
]


JSON = "application/json"

# The GET routes (/v1/models), FastAPI's own: the app includes them (``install_openai``).
openai_router = discovery_router


# ---------------------------------------------------------------------- routes


async def serve_completions(request: Request, raw: bytes) -> Response:
    backend = backend_of(request)
    body = parse_body(raw, oa.CompletionRequest)
    check_model(backend, body.model)
    items = body.prompt_items()
    prompts = []
    for param, prompt in items:
        if isinstance(prompt, str):
            ids = await encode(backend, prompt)
            if not ids:
                raise ApiError(400, f"{param} has no tokens", param=param)
        else:
            ids = list(prompt)
            client_error(check_token_ids, ids, backend.meta.vocab_size, param)
        prompts.append(ids)
    params = [param for param, _ in items]
    echo = None
    if body.echo:  # the prompt's own text (a token-id prompt's decoded)
        echo = [p if isinstance(p, str) else backend.meta.tokenizer.decode(p) for _, p in items]
    return await _serve(request, backend, body, prompts, TextAnswer, params, echo)


async def serve_chat(request: Request, raw: bytes) -> Response:
    backend = backend_of(request)
    body = parse_body(raw, oa.ChatCompletionRequest)
    check_model(backend, body.model)
    prompt_ids, parser, forced = await chat_prompt(backend, body)
    # With tools, the answer is read for tool calls by the template family's parser.
    answer_cls = ChatAnswer if parser is None else partial(ChatAnswer, tools=parser)
    return await _serve(
        request, backend, body, [prompt_ids], answer_cls, ["messages"], tool_grammar=forced
    )


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
        PostRoute("/v1/responses", "responses", serve_responses, ResponsesRequest),
        PostRoute("/tokenize", "tokenize", serve_tokenize, TokenizeRequest),
        PostRoute("/detokenize", "detokenize", serve_detokenize, DetokenizeRequest),
    )
}


# ---------------------------------------------------------------------- the serve path


async def _serve(
    request: Request,
    backend: Backend,
    body: oa.CompletionRequest | oa.ChatCompletionRequest,
    prompts: list[list[int]],
    answer_cls: type[TextAnswer] | type[ChatAnswer],
    prompt_params: list[str],
    echo: list[str] | None = None,
    tool_grammar: GrammarSpec | None = None,
) -> Response:
    """Serve one request of one or more prompts: each prompt is its own ``GenerateRequest``
    (placed by the backend on its own, all opened at once), answered as one response whose
    choice ``prompt_index * n + j`` is sample j of prompt ``prompt_index``."""
    plan = plan_prompts(backend, body, prompts, prompt_params, tool_grammar)
    params = plan.params
    ids_back = prompts if body.return_token_ids else None
    lp = LogprobFormatter(backend.meta.tokenizer) if params.logprobs is not None else None
    if answer_cls is TextAnswer:
        answer = TextAnswer(backend.meta.name, ids_back, lp, echo, prompts, n=params.n)
    else:
        answer = answer_cls(backend.meta.name, ids_back, lp, n=params.n)
    streams, headers = await open_prompts(
        backend, body, prompts, plan, answer.request_id, tool_grammar
    )
    if body.stream:
        return SSEResponse(sse_events(streams, answer, body.include_usage), headers)
    results = await collect(request, streams)
    ends = [last for samples in results for *_, last in samples]
    usage = usage_of(ends)
    headers["x-radixray-cached-tokens"] = str(usage["prompt_tokens_details"]["cached_tokens"])
    choices = [
        (answer.index(i, j), text, token_ids, last.finish_reason)
        for i, samples in enumerate(results)
        for j, text, token_ids, last in samples
    ]
    return json_answer(answer.response(choices, usage, ends), headers, floats=lp is not None)


def json_answer(body: dict, headers: dict[str, str], floats: bool) -> Response:
    """A whole answer as JSON. Without floats in it (``floats``: logprobs) msgspec writes the
    bytes ``JSONResponse`` would (compact, UTF-8, the same escapes) in a tenth of the time, ~8
    us of the router's CPU a request; floats go through ``JSONResponse``, whose ``json.dumps``
    spells exponents its own way (``1e-05``, msgspec ``0.00001``)."""
    if floats:
        return JSONResponse(body, headers=headers)
    return Response(msgspec.json.encode(body), headers=headers, media_type=JSON)
