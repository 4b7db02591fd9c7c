"""The serve path every generating route shares (completions, chat, responses): the length
checks, the ``SamplingParams`` built once, a ``GenerateRequest`` per prompt, all opened at once
(``streams.open_all``), and the tools a chat answer is read for."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import msgspec

from radixray.model_meta.chat_template import tool_family
from radixray.protocol import GenerateRequest, GrammarSpec, InvalidRequest, SamplingParams
from radixray.protocol.rules import check_context

from .backend import Backend, TokenStream
from .errors import ApiError
from .inputs import encode, render_chat
from .sampling import sampling_params
from .streams import open_all
from .tool_calls import ToolCallParser, parser_for
from .tool_grammar import tool_choice_grammar

__all__ = [
    "Opened",
    "Planned",
    "chat_prompt",
    "chat_tools",
    "max_tokens",
    "open_prompts",
    "plan_prompts",
    "session_key",
]


class Opened(NamedTuple):
    streams: list[TokenStream]
    headers: dict[str, str]  # x-radixray-worker, x-radixray-cached-tokens


def session_key(body) -> str | None:
    """The router's session key of a request: OpenAI's ``prompt_cache_key`` (which replaces
    ``user`` for cache-friendly routing), else ``user``: ``consistent_hash`` keys its ring on
    it. The ``prompt_cache_key`` alone also goes to the router as the request's cache key,
    by which ``ttft`` breaks exact ties the same way on every router (``Policy.pick_tied``)."""
    return getattr(body, "prompt_cache_key", None) or body.user


async def chat_prompt(
    backend: Backend, body
) -> tuple[list[int], ToolCallParser | None, GrammarSpec | None]:
    """A chat request's prompt ids (its messages and tools through the model's chat template)
    and how its answer is read for tools (``chat_tools``)."""
    text = render_chat(backend, body.plain_messages(), True, body.tool_dicts())
    return (await encode(backend, text), *chat_tools(backend, body))


def chat_tools(backend: Backend, body) -> tuple[ToolCallParser | None, GrammarSpec | None]:
    """How a chat request's answer is read for its tools: ``(parser, forced grammar)``, both
    None without tools (or with ``tool_choice`` "none"). The parser is the template family's;
    "required" or a named function forces the answer to be those calls by structured output."""
    if not body.tool_dicts():
        return None, None
    family = tool_family(getattr(backend.meta.tokenizer, "chat_template", None) or "")
    parallel = body.parallel_tool_calls is not False
    parser = parser_for(family, parallel)
    forced = tool_choice_grammar(body.tools, body.tool_choice, family, parallel)
    return parser, forced


class Planned(NamedTuple):
    params: SamplingParams  # the first prompt's; the others differ only in max_tokens
    limits: list[int]  # each prompt's max_tokens


def plan_prompts(
    backend: Backend,
    body,
    prompts: list[list[int]],
    prompt_params: list[str],
    tool_grammar: GrammarSpec | None = None,
) -> Planned:
    """Check each prompt's length and build the sampling parameters once."""
    limits = [
        max_tokens(backend, len(ids), body.token_limit, param, body.default_max_tokens)
        for ids, param in zip(prompts, prompt_params, strict=True)
    ]
    params = sampling_params(body, limits[0], backend.meta.vocab_size, tool_grammar)
    return Planned(params, limits)


async def open_prompts(
    backend: Backend,
    body,
    prompts: list[list[int]],
    plan: Planned,
    request_id: Callable[[int], str],
    tool_grammar: GrammarSpec | None = None,
) -> Opened:
    """Open one request per prompt (``request_id(i)`` names prompt i's), all or none."""
    reqs = [
        GenerateRequest(
            request_id(i),
            ids,
            plan.params
            if limit == plan.limits[0]
            else msgspec.structs.replace(plan.params, max_tokens=limit),
            body.cache_salt,
        )
        for i, (ids, limit) in enumerate(zip(prompts, plan.limits, strict=True))
    ]
    try:
        streams = await open_all(
            backend, reqs, session_key(body), getattr(body, "prompt_cache_key", None)
        )
    except ApiError as e:
        if tool_grammar is not None and e.param == "response_format":
            e.param = "tools"  # the grammar the worker refused was the forced tools'
        raise
    headers = {
        "x-radixray-worker": ",".join(str(s.worker_id) for s in streams),
        "x-radixray-cached-tokens": str(sum(s.cached_tokens for s in streams)),
    }
    return Opened(streams, headers)


def max_tokens(
    backend: Backend, num_prompt: int, requested: int | None, prompt_param: str, default=None
) -> int:
    """The request's max_tokens, or else ``default`` or the room left in the context, at most the
    server's cap either way; the context-length rule is the workers' own (``check_context``)."""
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
    if requested is not None:
        return requested
    return min(limit - num_prompt, cap, default or cap)
