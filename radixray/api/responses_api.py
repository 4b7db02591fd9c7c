"""OpenAI's Responses API on the chat path: ``POST /v1/responses`` (whole or streamed), and
``GET`` / ``DELETE /v1/responses/{id}`` and ``GET /v1/responses/{id}/input_items`` for
stored responses.

A request is turned into the chat request it means (``responses_request.py``): instructions,
the stored history of ``previous_response_id`` and the request's own input become messages
rendered by the model's chat template, tools and ``text.format`` become chat's tools and
structured output. It is then placed, opened and generated exactly as a chat completion
(``serve_path.py``); only the answer's shape differs (``responses_output.py``). Errors name the
Responses field (``input``, ``text.format``, ``max_output_tokens``), not the chat one.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from radixray.protocol import RequestError

from .answers import event
from .backend import TokenStream
from .errors import ApiError
from .inputs import backend_of, check_model, parse_body
from .response_store import ResponseStore
from .responses_output import ResponseDraft
from .responses_request import ResponsesRequest
from .serve_path import chat_prompt, open_prompts, plan_prompts
from .sse import SSEResponse
from .streams import collect, usage_of

__all__ = ["ResponsesRequest", "responses_router", "serve_responses"]

responses_router = APIRouter()

# Chat's names of a field -> the Responses request's.
_PARAMS = {
    "messages": "input",
    "response_format": "text.format",
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
}


def _renamed(e: ApiError) -> ApiError:
    if e.param is not None:
        head, dot, rest = e.param.partition(".")
        base, bracket, index = head.partition("[")
        if base in _PARAMS:
            e.param = _PARAMS[base] + bracket + index + dot + rest
            e.message = e.message.replace(base, _PARAMS[base], 1)
    return e


def store_of(request: Request) -> ResponseStore:
    return request.app.state.responses


async def serve_responses(request: Request, raw: bytes) -> Response:
    try:
        return await _serve(request, raw)
    except ApiError as e:
        raise _renamed(e) from None


async def _serve(request: Request, raw: bytes) -> Response:
    backend = backend_of(request)
    store = store_of(request)
    body = parse_body(raw, ResponsesRequest)
    check_model(backend, body.model)
    history: list[dict] = []
    if body.previous_response_id is not None:
        prev = store.get(body.previous_response_id, "previous_response_id")
        history = prev.input_items + output_as_input(prev.response["output"])
    try:
        chat = body.chat_request(history)
    except ValidationError as e:
        raise RequestValidationError(e.errors(include_url=False)) from None
    prompt_ids, parser, forced = await chat_prompt(backend, chat)
    plan = plan_prompts(backend, chat, [prompt_ids], ["input"], forced)
    draft = ResponseDraft(store.new_id(), backend.meta.name, _echo(body), parser)
    (stream,), headers = await open_prompts(
        backend, chat, [prompt_ids], plan, lambda _: draft.id, forced
    )
    items = history + body.items  # what a continuation of this response starts from
    listed = listed_items(body.items)

    def keep() -> None:
        if body.store:
            store.put(draft.response(), items, listed)

    if body.stream:
        return SSEResponse(_events(stream, draft, keep), headers)
    ((_, text, _, last),) = (await collect(request, [stream]))[0]
    draft.feed(text)
    draft.finish(last, responses_usage(usage_of([last])))
    headers["x-radixray-cached-tokens"] = str(last.cached_tokens)
    keep()
    return JSONResponse(draft.response(), headers=headers)


async def _events(
    stream: TokenStream, draft: ResponseDraft, keep: Callable[[], None]
) -> AsyncIterator[bytes]:
    """The answer's events as SSE (``event:`` names each, as OpenAI's do; no ``[DONE]``);
    ``keep()`` stores the response once it has ended (not when it failed)."""
    try:
        for e in draft.opening():
            yield _sse(e)
        try:
            async for c in stream:
                for e in draft.feed(c.text):
                    yield _sse(e)
                if c.ended:
                    for e in draft.finish(c, responses_usage(usage_of([c]))):
                        yield _sse(e)
                    break
        except RequestError as err:  # a worker failed after the answer started
            for e in draft.fail(err.message):
                yield _sse(e)
            return
        keep()
    finally:
        await stream.aclose()


def _sse(e: dict) -> bytes:
    return b"event: " + e["type"].encode() + b"\n" + event(e)


def responses_usage(chat_usage: dict) -> dict:
    """Chat's usage in the Responses API's names (no reasoning tokens: the models here do not
    reason apart from their answer)."""
    return {
        "input_tokens": chat_usage["prompt_tokens"],
        "input_tokens_details": {
            "cached_tokens": chat_usage["prompt_tokens_details"]["cached_tokens"]
        },
        "output_tokens": chat_usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": chat_usage["total_tokens"],
    }


def output_as_input(output: list[dict]) -> list[dict]:
    """A response's output items as the input items of its continuation."""
    out = []
    for item in output:
        if item["type"] == "message":
            text = "".join(p["text"] for p in item["content"])
            out.append({"type": "message", "role": "assistant", "content": text})
        elif item["type"] == "function_call":
            out.append(
                {
                    "type": "function_call",
                    "call_id": item["call_id"],
                    "name": item["name"],
                    "arguments": item["arguments"],
                }
            )
    return out


def _echo(body: ResponsesRequest) -> dict:
    """The request's fields a response object carries back."""
    fmt = body.text.format if body.text is not None else None
    tools = [
        {
            "type": "function",
            "name": t["function"]["name"],
            "description": t["function"].get("description"),
            "parameters": t["function"].get("parameters"),
            "strict": t["function"].get("strict"),
        }
        for t in body.tools or ()
    ]
    return {
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "metadata": body.metadata or {},
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "prompt_cache_key": body.prompt_cache_key,
        "reasoning": {"effort": None, "summary": None},
        "safety_identifier": body.safety_identifier,
        "store": body.store,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "text": {
            "format": {"type": "text"}
            if fmt is None
            else fmt.model_dump(by_alias=True, exclude_none=True)
        },
        "tool_choice": body.tool_choice or "auto",
        "tools": tools,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "truncation": body.truncation or "disabled",
        "user": body.user,
        "background": False,
    }


@responses_router.get("/v1/responses/{response_id}")
async def retrieve_response(request: Request, response_id: str):
    """A stored response, as it was answered."""
    return store_of(request).get(response_id).response


def listed_items(items: list[dict]) -> list[dict]:
    """A request's own input items as ``GET /v1/responses/{id}/input_items`` lists them:
    OpenAI's item shapes, each with an id of its own."""
    out = []
    for item in items:
        kind = item["type"]
        if kind == "message":
            part = "output_text" if item["role"] == "assistant" else "input_text"
            listed = {
                "id": f"msg_{uuid.uuid4().hex}",
                "type": "message",
                "role": item["role"],
                "status": "completed",
                "content": [{"type": part, "text": item["content"]}],
            }
            if part == "output_text":
                listed["content"][0]["annotations"] = []
        else:
            prefix = "fc" if kind == "function_call" else "fco"
            listed = {"id": f"{prefix}_{uuid.uuid4().hex}", **item, "status": "completed"}
        out.append(listed)
    return out


@responses_router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(
    request: Request,
    response_id: str,
    order: Literal["asc", "desc"] = "desc",
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: str | None = None,
):
    """The input items of a stored response (its own, not earlier turns'), OpenAI's page of
    them: newest first by default, ``limit`` at a time, ``after`` an item id to go on from."""
    items = store_of(request).get(response_id).listed
    items = items[::-1] if order == "desc" else list(items)
    if after is not None:
        ids = [i["id"] for i in items]
        if after not in ids:
            raise ApiError(
                404, f"No input item '{after}' in response '{response_id}'", param="after"
            )
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > limit,
    }


@responses_router.delete("/v1/responses/{response_id}")
async def delete_response(request: Request, response_id: str):
    store_of(request).delete(response_id)
    return {"id": response_id, "object": "response", "deleted": True}
