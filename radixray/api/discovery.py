"""Discovery: what a client asks before it sends work. ``GET /v1/models`` (OpenAI's model list,
with vLLM's ``max_model_len``), and vLLM's ``GET /tokenizer_info``, ``POST /tokenize`` and
``POST /detokenize``, from the backend's own tokenizer (torch-free: on the router it is
``radixray.model_meta``'s).

The GET routes are FastAPI routes (``discovery_router``); the POST ones are served and
documented like the completion routes, from their request schemas (``openai_routes``'s
``REQUEST_MODELS``)."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, model_validator
from pydantic_core import PydanticCustomError

from radixray.protocol.rules import check_token_ids

from .inputs import (
    INLINE_TOKENIZE_CHARS,
    backend_of,
    check_model,
    client_error,
    encode,
    parse_body,
    render_chat,
)
from .schemas import ChatMessage, plain_messages
from .tool_schemas import Tool, check_tools

__all__ = [
    "DetokenizeRequest",
    "TokenizeRequest",
    "discovery_router",
    "list_models",
    "model_card",
    "retrieve_model",
    "serve_detokenize",
    "serve_tokenize",
    "tokenizer_info",
]

discovery_router = APIRouter()


class TokenizeRequest(BaseModel):
    """vLLM's /tokenize: a text ``prompt`` (as /v1/completions takes it) or chat ``messages``
    with their ``tools`` (rendered with the model's chat template, as /v1/chat/completions
    renders them: the same ids, so ``count`` is that chat's ``prompt_tokens``)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    add_generation_prompt: StrictBool | None = None  # with messages; default True
    tools: Annotated[list[Tool], Field(min_length=1)] | None = None  # with messages
    # vLLM's default is True; radixray's /v1/completions adds none, so /tokenize neither,
    # by default: its ids are the ones a completion of the same prompt would run on.
    add_special_tokens: StrictBool = False

    @model_validator(mode="after")
    def _one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise PydanticCustomError(
                "invalid_value",
                "{reason}",
                {"reason": "send either prompt or messages", "param": "prompt"},
            )
        for name in ("add_generation_prompt", "tools"):
            if self.messages is None and getattr(self, name) is not None:
                raise PydanticCustomError(
                    "invalid_value",
                    "{reason}",
                    {"reason": f"{name} applies to messages only", "param": name},
                )
        check_tools(self.tools, None)
        return self

    def plain_messages(self) -> list[dict[str, str]]:
        return plain_messages(self.messages or [])

    def tool_dicts(self) -> list[dict] | None:
        """The tools as the chat route hands them to the template (``tool_dicts`` there)."""
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None


class DetokenizeRequest(BaseModel):
    """vLLM's /detokenize: token ids back to their text (special tokens included)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    tokens: list[StrictInt]


def model_card(name: str, max_model_len: int, created: int) -> dict:
    """One entry of /v1/models: OpenAI's fields plus vLLM's ``root``, ``parent`` and
    ``max_model_len`` (the context length a prompt plus its completion must fit in)."""
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "radixray",
        "root": name,
        "parent": None,
        "max_model_len": max_model_len,
    }


@discovery_router.get("/v1/models")
async def list_models(request: Request):
    return {"object": "list", "data": [_model_card(request)]}


@discovery_router.get("/v1/models/{model:path}")  # a served name may hold a slash
async def retrieve_model(request: Request, model: str):
    check_model(backend_of(request), model)
    return _model_card(request)


@discovery_router.get("/tokenizer_info")
async def tokenizer_info(request: Request):
    """vLLM's /tokenizer_info (served by default here: it holds nothing secret): what a client
    needs to use the server's own tokenizer through /tokenize and /detokenize, as
    lm-evaluation-harness's remote tokenizer does (it finds the end of text from
    ``eos_token``, and renders chats with ``chat_template``)."""
    meta = backend_of(request).meta
    tok = meta.tokenizer

    def text(token_id: int | None) -> str | None:
        return None if token_id is None else tok.decode([token_id], skip_special_tokens=False)

    return {
        "tokenizer_class": type(tok).__name__,
        "eos_token": text(tok.eos_token_id),
        "bos_token": text(tok.bos_token_id),
        "pad_token": text(tok.pad_token_id),
        "add_bos_token": bool(getattr(tok, "add_bos_token", False)),
        "chat_template": getattr(tok, "chat_template", None),
        "model_max_length": meta.max_model_len,
        "vocab_size": tok.vocab_size,
    }


def _model_card(request: Request) -> dict:
    meta = backend_of(request).meta
    return model_card(meta.name, meta.max_model_len, request.app.state.created)


async def serve_tokenize(request: Request, raw: bytes) -> Response:
    """vLLM's /tokenize: the ids a completion (``prompt``) or a chat (``messages``) would run
    on, their count, and the context length they must fit in."""
    backend = backend_of(request)
    body = parse_body(raw, TokenizeRequest)
    if body.model is not None:
        check_model(backend, body.model)
    if body.messages is not None:
        gen = body.add_generation_prompt is not False
        text = render_chat(backend, body.plain_messages(), gen, body.tool_dicts())
    else:
        text = body.prompt
    ids = await encode(backend, text, body.add_special_tokens)
    meta = backend.meta
    return JSONResponse({"count": len(ids), "max_model_len": meta.max_model_len, "tokens": ids})


async def serve_detokenize(request: Request, raw: bytes) -> Response:
    """vLLM's /detokenize: the text of token ids, special tokens written out (so that
    /tokenize's ids of a rendered chat come back as that chat's text)."""
    backend = backend_of(request)
    body = parse_body(raw, DetokenizeRequest)
    if body.model is not None:
        check_model(backend, body.model)
    client_error(check_token_ids, body.tokens, backend.meta.vocab_size, "tokens")
    decode = backend.meta.tokenizer.decode
    if len(body.tokens) <= INLINE_TOKENIZE_CHARS:
        text = decode(body.tokens, skip_special_tokens=False)
    else:
        text = await asyncio.to_thread(decode, body.tokens, skip_special_tokens=False)
    return JSONResponse({"prompt": text})
