"""OpenAI request schemas (pydantic, at the HTTP edge only); the response builders are in
``responses.py`` and re-exported here.

Requests are validated strictly: an unknown field, a wrong type or an out-of-range value is a 400
whose error names the parameter, as OpenAI's API does. Responses are plain dicts in OpenAI's
shape so that the official ``openai`` client parses them.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from radixray.protocol import MAX_SAMPLES

from .responses import (
    chat_choice,
    chat_chunk,
    chat_response,
    completion_choice,
    completion_chunk,
    completion_response,
    usage,
)
from .structured import ResponseFormat, StructuredOutputs
from .tool_schemas import NamedToolChoice, Tool, ToolCall, check_tools, template_messages

__all__ = [
    "CompletionRequest",
    "ChatCompletionRequest",
    "ChatMessage",
    "MAX_PROMPTS",
    "chat_choice",
    "completion_choice",
    "completion_response",
    "completion_chunk",
    "plain_messages",
    "chat_response",
    "chat_chunk",
    "usage",
]

MAX_STOP = 4  # OpenAI allows up to 4 stop sequences
MAX_LOGIT_BIAS = 100.0  # OpenAI's range for a logit_bias value: [-100, 100]


def _range(lo: float, hi: float, want: str | None = None, open_low: bool = False):
    """A float field whose 400 states the whole range (pydantic's names one bound)."""
    want = want or f"a number in [{lo:g}, {hi:g}]"

    def check(v: float) -> float:
        if not ((lo < v if open_low else lo <= v) and v <= hi and v < math.inf):
            raise ValueError(f"must be {want}, got {v!r}")
        return v

    bounds = {"exclusiveMinimum" if open_low else "minimum": lo}
    if hi < math.inf:
        bounds["maximum"] = hi
    return Annotated[float, AfterValidator(check), Field(json_schema_extra=bounds)]


def _top_k(v: int) -> int:
    if not -1 <= v < 2**31:
        raise ValueError(f"must be -1 or 0 (off) or an int in [1, 2**31), got {v}")
    return v


_Penalty = _range(-2.0, 2.0)
_RepetitionPenalty = _range(0.0, math.inf, "a finite number > 0", open_low=True)
_MinP = _range(0.0, 1.0)
_TopK = Annotated[
    StrictInt,
    AfterValidator(_top_k),
    Field(json_schema_extra={"minimum": -1, "maximum": 2**31 - 1}),
]


def _logit_bias(v: dict[str, float]) -> dict[str, float]:
    for key, bias in v.items():
        if not (key.isascii() and key.isdigit() and len(key) <= 10 and int(key) < 2**31):
            raise ValueError(f"keys must be token ids (decimal strings), got {key!r}")
        if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            raise ValueError(f"values must be numbers in [-100, 100], got {bias!r} for {key}")
    return v


# Prompts in one /v1/completions request. Each is placed as its own request, so one body could
# otherwise fan out into as many requests as the body limit holds one-token prompts.
MAX_PROMPTS = 256


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    stop: str | list[str] | None = None
    seed: Annotated[StrictInt, Field(ge=-(2**63), lt=2**63)] | None = None
    user: str | None = None
    stream: StrictBool = False
    stream_options: dict[str, Any] | None = None
    n: Annotated[StrictInt, Field(ge=1, le=MAX_SAMPLES)] | None = 1  # null: 1
    # Extensions vLLM and SGLang accept too: generate exactly max_tokens (benchmarks).
    ignore_eos: StrictBool = False
    # The sampling controls (docs/openai_api.md): OpenAI's penalties and logit_bias, vLLM's
    # extensions (top_k, min_p, repetition_penalty, min_tokens, stop_token_ids). Token ids are
    # checked against the vocabulary when the request is served (radixray/api/sampling.py).
    # null means the default, as for vLLM.
    presence_penalty: _Penalty | None = 0.0
    frequency_penalty: _Penalty | None = 0.0
    repetition_penalty: _RepetitionPenalty | None = 1.0
    min_p: _MinP | None = 0.0
    top_k: _TopK | None = -1
    min_tokens: Annotated[StrictInt, Field(ge=0)] | None = 0
    stop_token_ids: list[Annotated[StrictInt, Field(ge=0)]] | None = None
    logit_bias: Annotated[dict[str, StrictFloat], AfterValidator(_logit_bias)] | None = None
    # vLLM's tenant isolation field: requests with different salts never share cached pages
    # (on the worker and in the router's index), so one tenant cannot time another's prefixes.
    cache_salt: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    # OpenAI's field for cache-friendly routing: the router's session key (it replaces ``user``
    # there; ``radixray/api/serve_path.py``, ``session_key``). ``safety_identifier``: OpenAI's
    # abuse-tracking id, accepted and unused.
    prompt_cache_key: Annotated[str, Field(max_length=1024)] | None = None
    safety_identifier: Annotated[str, Field(max_length=1024)] | None = None
    # vLLM's extension: the answer carries the prompt's token ids (``prompt_token_ids``) and the
    # generated ones (``token_ids``, per chunk when streaming), exactly what the engine saw and
    # sampled: a client can resend them without re-tokenizing (RL rollouts), a replay can
    # rebuild the cache the engine had.
    return_token_ids: StrictBool = False
    # Structured output (radixray/api/structured.py): OpenAI's response_format, vLLM's
    # structured_outputs and its older guided_* aliases; at most one per request.
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: Annotated[str, Field(min_length=1)] | None = None
    guided_choice: (
        Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] | None
    ) = None
    guided_grammar: Annotated[str, Field(min_length=1)] | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        if v is None:
            return None
        stops = [v] if isinstance(v, str) else v
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences are allowed")
        if any(not s for s in stops):
            raise ValueError("stop sequences must be non-empty strings")
        return stops

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, v):
        if v is not None and set(v) - {"include_usage"}:
            raise ValueError("stream_options supports only include_usage")
        return v

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


class CompletionRequest(_Sampling):
    # One prompt (a string, or its token ids) or a list of prompts (all strings or all token-id
    # lists), as OpenAI accepts; each prompt of a list is its own request (``prompt_items``).
    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]]
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = 16
    # The prompt's text before the completion; with logprobs, its tokens' logprobs too.
    echo: StrictBool = False
    logprobs: Annotated[StrictInt, Field(ge=0, le=5)] | None = None  # OpenAI's range
    suffix: None = None
    best_of: Annotated[StrictInt, Field(ge=1, le=1)] | None = None

    @property
    def token_limit(self) -> int | None:
        """The client's max_tokens; None when it sent none (OpenAI's default of 16 then applies,
        bounded by what the server allows, instead of a 400 for a value nobody asked for)."""
        return self.max_tokens if "max_tokens" in self.model_fields_set else None

    default_max_tokens: ClassVar[int | None] = 16  # OpenAI's, for completions

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, v):
        _check_prompt(v)
        return v

    def prompt_items(self) -> list[tuple[str, str | list[int]]]:
        """``(param, prompt)`` per prompt, in order: the parameter an error about it names
        (``prompt``, or ``prompt[i]`` in a list of prompts) and the prompt (text or ids)."""
        p = self.prompt
        if isinstance(p, str) or isinstance(p[0], int):
            return [("prompt", p)]
        return [(f"prompt[{i}]", x) for i, x in enumerate(p)]


def _prompt_error(param: str, reason: str) -> PydanticCustomError:
    """A prompt error that names its element: ``errors.py`` reports ``ctx["param"]``."""
    return PydanticCustomError("invalid_prompt", "{reason}", {"reason": reason, "param": param})


def _kind(x) -> str:
    if isinstance(x, str):
        return "a string"
    if type(x) is int:
        return "a token id"
    if isinstance(x, list):
        return "a list of token ids"
    return f"a {type(x).__name__}"


def _check_prompt(v) -> None:
    """What the field's type cannot say, with the element named: no empty prompt, no empty
    list, no mixed list, no negative token id (ids past the vocabulary are the edge's check,
    which knows the model). Other types are left to the field's own type error."""
    if isinstance(v, str):
        if not v:
            raise _prompt_error("prompt", "prompt must not be empty")
        return
    if not isinstance(v, list):
        return
    if not v:
        raise _prompt_error("prompt", "prompt must not be an empty list")
    if type(v[0]) is int:  # one prompt as token ids
        for i, t in enumerate(v):
            if type(t) is not int:
                raise _prompt_error(
                    f"prompt[{i}]", f"prompt[{i}] is {_kind(t)} in a list of token ids"
                )
            if t < 0:
                raise _prompt_error("prompt", f"token ids must be >= 0, got {t}")
        return
    if len(v) > MAX_PROMPTS:
        raise _prompt_error("prompt", f"at most {MAX_PROMPTS} prompts per request, got {len(v)}")
    first = _kind(v[0])
    if first not in ("a string", "a list of token ids"):
        raise _prompt_error(
            "prompt[0]", f"a prompt is a string or a list of token ids, not {first}"
        )
    for i, p in enumerate(v):
        param = f"prompt[{i}]"
        if _kind(p) != first:
            raise _prompt_error(
                param,
                f"{param} is {_kind(p)} but prompt[0] is {first}: a list of prompts holds "
                "only strings or only lists of token ids",
            )
        if not p:
            raise _prompt_error(param, f"{param} must not be empty")
        if isinstance(p, list):
            for t in p:
                if type(t) is not int or t < 0:
                    raise _prompt_error(param, f"{param} holds {t!r}; token ids are ints >= 0")


class _ContentPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


# What the one message model cannot say in its field types, said in its JSON schema (so that
# /openapi.json, and the fuzzing that reads it, know): content is required but for an assistant
# message, a tool message names the call it answers.
_MESSAGE_RULES = {
    "allOf": [
        {
            "if": {"properties": {"role": {"enum": ["system", "developer", "user", "tool"]}}},
            "then": {"required": ["content"], "properties": {"content": {"not": {"type": "null"}}}},
        },
        {"if": {"properties": {"role": {"const": "tool"}}}, "then": {"required": ["tool_call_id"]}},
    ]
}


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_MESSAGE_RULES)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    # Required but for an assistant message with tool_calls (``plain_messages`` checks it).
    content: str | list[_ContentPart] | None = None
    name: str | None = None
    tool_calls: Annotated[list[ToolCall], Field(min_length=1)] | None = None  # assistant's
    tool_call_id: str | None = None  # a tool message's: the call it answers

    @property
    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    logprobs: StrictBool | None = None
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=20)] | None = None
    # OpenAI's function tools (docs/openai_api.md, "Tools"): rendered through the model's chat
    # template, its answer read back into tool_calls by the template family's parser.
    tools: Annotated[list[Tool], Field(min_length=1)] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None

    @model_validator(mode="after")
    def _tools(self):
        check_tools(self.tools, self.tool_choice)
        return self

    default_max_tokens: ClassVar[int | None] = None  # the room left in the context

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def tool_dicts(self) -> list[dict] | None:
        """The tools as a chat template takes them; None without any or with choice "none"."""
        on = self.tools and self.tool_choice != "none"
        return [t.model_dump(exclude_none=True) for t in self.tools] if on else None

    def plain_messages(self) -> list[dict]:
        return plain_messages(self.messages)


plain_messages = template_messages  # messages as a chat template takes them
