"""The Responses API's request (``POST /v1/responses``), checked at the edge and turned into the
chat request it rides on: ``input`` items into chat messages, function tools into chat tools,
``text.format`` into ``response_format``. Nothing generates differently from a chat
completion: the same template, tools, structured output, placement and prefix reuse.

Checked strictly where a field changes what is generated (a bad one is a 400 naming it, as
``input[2].arguments``); items a client sends back from an earlier response (its output items,
with ids and statuses) are read for what they mean and their other fields are ignored. Fields
that change nothing here are accepted (``include``, ``metadata``, ``truncation``, ``store``'s
siblings, ``reasoning`` on a model without reasoning); built-in tools and ``background`` are
400s naming the field.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    StrictInt,
    field_validator,
    model_validator,
)
from pydantic import ValidationError as PydanticValidationError

from .schemas import ChatCompletionRequest
from .structured import JsonSchemaFormat
from .tool_schemas import FunctionDef, field_error

__all__ = ["ResponsesRequest", "text_of"]

# The Responses API's built-in tools: run by OpenAI's servers, not by a model on a worker.
_BUILT_IN_TOOLS = (
    "web_search",
    "web_search_preview",
    "file_search",
    "code_interpreter",
    "computer_use_preview",
    "image_generation",
    "mcp",
    "local_shell",
    "shell",
    "custom",
    "apply_patch",
    "tool_search",
)
_TEXT_PARTS = ("input_text", "output_text", "text")
_ROLES = ("user", "assistant", "system", "developer")


def text_of(content: Any, param: str) -> str:
    """The text of a message's ``content``: a string, or a list of text parts joined (an
    assistant's ``refusal`` part counts as its text). Images, files and audio are refused:
    the models served here read text."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise field_error(param, f"{param} must be a string or a list of content parts")
    out = []
    for j, part in enumerate(content):
        where = f"{param}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS or kind == "refusal":
            value = part.get("refusal" if kind == "refusal" else "text")
            if not isinstance(value, str):
                raise field_error(f"{where}.text", f"{where} of type {kind} needs its text")
            out.append(value)
        elif kind in ("input_image", "input_file", "input_audio"):
            raise field_error(
                f"{where}.type", f"{where} is {kind}: the model served here reads text only"
            )
        else:
            raise field_error(
                f"{where}.type",
                f"{where}.type must be one of input_text, output_text, refusal; got {kind!r}",
            )
    return "".join(out)


def _string(item: dict, key: str, param: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise field_error(f"{param}.{key}", f"{param}.{key} must be a non-empty string")
    return value


def _input_item(item: Any, i: int) -> dict | None:
    """One ``input`` item as ``{"type": "message" | "function_call" | "function_call_output",
    ...}`` with only what it means; None for an item that carries nothing a model here reads
    (another model's ``reasoning``)."""
    param = f"input[{i}]"
    if not isinstance(item, dict):
        raise field_error(param, f"{param} must be an object (a message or an item)")
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        role = item.get("role")
        if role not in _ROLES:
            raise field_error(
                f"{param}.role", f"{param}.role must be one of {', '.join(_ROLES)}; got {role!r}"
            )
        content = text_of(item.get("content"), f"{param}.content")
        return {"type": "message", "role": role, "content": content}
    if kind == "function_call":
        arguments = item.get("arguments")
        try:
            args = json.loads(arguments) if isinstance(arguments, str) else None
        except ValueError:
            args = None
        if not isinstance(args, dict):
            raise field_error(
                f"{param}.arguments",
                f"{param}.arguments must be a JSON object as a string, got {arguments!r:.100}",
            )
        return {
            "type": "function_call",
            "call_id": _string(item, "call_id", param),
            "name": _string(item, "name", param),
            "arguments": arguments,
        }
    if kind == "function_call_output":
        output = item.get("output")
        return {
            "type": "function_call_output",
            "call_id": _string(item, "call_id", param),
            "output": text_of(output, f"{param}.output"),
        }
    if kind == "reasoning":
        return None
    if kind == "item_reference":
        raise field_error(
            param,
            f"{param} is an item_reference: items are not stored on their own here; continue "
            "a stored response with previous_response_id",
        )
    raise field_error(
        f"{param}.type",
        f"{param}.type must be message, function_call or function_call_output; got {kind!r}",
    )


def _tool(tool: Any, i: int) -> dict:
    param = f"tools[{i}]"
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind != "function":
        if kind in _BUILT_IN_TOOLS or (isinstance(kind, str) and kind.startswith("web_search")):
            reason = f"the built-in tool {kind} is not served here: only function tools are"
        else:
            reason = f"{param}.type must be 'function', got {kind!r}"
        raise field_error(f"{param}.type", reason)
    fields = {k: v for k, v in tool.items() if k != "type"}
    try:
        fn = FunctionDef.model_validate(fields)
    except PydanticValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise field_error(f"{param}.{loc}" if loc else param, first["msg"]) from None
    return {"type": "function", "function": fn.model_dump(exclude_none=True)}


class _FormatSchema(JsonSchemaFormat):
    type: Literal["json_schema"]


class _FormatPlain(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object"]


class _Text(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: Annotated[_FormatSchema | _FormatPlain, Field(discriminator="type")] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # for reasoning models; unused


class _Reasoning(BaseModel):
    model_config = ConfigDict(extra="allow")  # effort, summary, ...: the model does not reason


class ResponsesRequest(BaseModel):
    """``POST /v1/responses``. ``input`` is a string (one user message) or a list of items;
    ``instructions`` becomes the first (system) message; ``previous_response_id`` puts a
    stored response's input and output before ``input``."""

    model_config = ConfigDict(extra="forbid")

    model: str
    input: str | list[Any]
    instructions: str | None = None
    previous_response_id: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    text: _Text | None = None
    max_output_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    stream: StrictBool = False
    store: StrictBool = True  # OpenAI's default
    # Routing: the session key of the router (``serve_path.session_key``), as for chat.
    prompt_cache_key: Annotated[str, Field(max_length=1024)] | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None  # echoed back, as OpenAI does
    # Accepted, and change nothing here.
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    reasoning: _Reasoning | None = None
    prompt_cache_retention: str | None = None
    stream_options: dict[str, Any] | None = None
    background: StrictBool | None = None
    # Extensions, as on chat: a seed for the sampler, a tenant's cache partition.
    seed: Annotated[StrictInt, Field(ge=-(2**63), lt=2**63)] | None = None
    cache_salt: Annotated[str, Field(min_length=1, max_length=256)] | None = None

    @field_validator("input")
    @classmethod
    def _input(cls, v):
        if isinstance(v, str):
            if not v:
                raise field_error("input", "input must not be empty")
            return [{"type": "message", "role": "user", "content": v}]
        if not v:
            raise field_error("input", "input must not be an empty list")
        items = [x for i, item in enumerate(v) if (x := _input_item(item, i)) is not None]
        if not items:
            raise field_error("input", "input holds no message or item the model reads")
        return items

    @field_validator("tools")
    @classmethod
    def _tools(cls, v):
        return None if v is None else [_tool(t, i) for i, t in enumerate(v)]

    _tools_as_chat: tuple = PrivateAttr(default=(None, None))

    @model_validator(mode="after")
    def _tool_choice(self):
        self._tools_as_chat = self._chat_tools()
        return self

    @field_validator("background")
    @classmethod
    def _background(cls, v):
        if v:
            raise field_error("background", "background responses are not served here")
        return v

    @property
    def items(self) -> list[dict]:
        """The request's own input items (normalized)."""
        return self.input  # type: ignore[return-value]

    def chat_request(self, history: list[dict]) -> ChatCompletionRequest:
        """The chat request this one rides on: ``history`` (a stored response's items) and
        the request's own items as messages, after ``instructions``."""
        messages = (
            [] if self.instructions is None else [{"role": "system", "content": self.instructions}]
        ) + chat_messages(history + self.items)
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "stream": self.stream,
        }
        tools, choice = self._tools_as_chat
        if tools:
            body["tools"] = tools
        if choice is not None:
            body["tool_choice"] = choice
        for name in (
            "parallel_tool_calls",
            "temperature",
            "top_p",
            "seed",
            "cache_salt",
            "user",
            "prompt_cache_key",
        ):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        if self.max_output_tokens is not None:
            body["max_completion_tokens"] = self.max_output_tokens
        fmt = self.text.format if self.text is not None else None
        if choice == "required" or isinstance(choice, dict):
            fmt = None  # the answer is forced to be calls: there is no text to format
        if isinstance(fmt, _FormatSchema):
            spec = fmt.model_dump(by_alias=True, exclude_none=True, exclude={"type"})
            body["response_format"] = {"type": "json_schema", "json_schema": spec}
        elif fmt is not None and fmt.type == "json_object":
            body["response_format"] = {"type": "json_object"}
        return ChatCompletionRequest.model_validate(body)

    def _chat_tools(self) -> tuple[list[dict] | None, Any]:
        """The tools and tool choice in chat's shape; ``allowed_tools`` narrows the tools."""
        tools, choice = self.tools, self.tool_choice
        if isinstance(choice, str):
            if choice not in ("auto", "none", "required"):
                raise field_error(
                    "tool_choice", f"tool_choice must be auto, none or required; got {choice!r}"
                )
            return tools, choice
        if choice is None:
            return tools, None
        kind = choice.get("type")
        if kind == "function":
            name = choice.get("name")
            if not isinstance(name, str):
                raise field_error("tool_choice.name", "tool_choice of type function names it")
            return tools, {"type": "function", "function": {"name": name}}
        if kind == "allowed_tools":
            mode = choice.get("mode", "auto")
            allowed = choice.get("tools")
            if mode not in ("auto", "required") or not isinstance(allowed, list):
                raise field_error(
                    "tool_choice",
                    "allowed_tools takes mode (auto or required) and tools (a list)",
                )
            names = {t.get("name") for t in allowed if isinstance(t, dict)}
            return [t for t in tools or () if t["function"]["name"] in names], mode
        raise field_error(
            "tool_choice.type",
            f"tool_choice.type must be function or allowed_tools; got {kind!r} (built-in tools "
            "are not served here)",
        )


def chat_messages(items: list[dict]) -> list[dict]:
    """Normalized Responses items as chat messages: an assistant message and the function
    calls after it are one assistant message with ``tool_calls``; a call's output is a tool
    message answering its ``call_id``."""
    out: list[dict] = []
    for item in items:
        kind = item["type"]
        if kind == "message":
            out.append({"role": item["role"], "content": item["content"]})
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
    return out
