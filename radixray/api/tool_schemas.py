"""OpenAI's function tools in a chat request (pydantic, at the HTTP edge): ``tools``,
``tool_choice``, an assistant message's ``tool_calls``; checked so that a bad one is a 400
naming the field (``errors.py`` reports a ``PydanticCustomError``'s ``param``)."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator
from pydantic_core import PydanticCustomError

from .errors import ApiError

__all__ = [
    "FunctionDef",
    "NamedToolChoice",
    "Tool",
    "ToolCall",
    "check_tools",
    "field_error",
    "template_messages",
]

MAX_TOOLS = 128  # OpenAI's limit on tools per request


def field_error(param: str, reason: str) -> PydanticCustomError:
    """An error whose 400 names ``param`` (an element of a list, a nested field)."""
    return PydanticCustomError("invalid_value", "{reason}", {"reason": reason, "param": param})


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # OpenAI's rule for a function's name: a-z, A-Z, 0-9, underscores and dashes, at most 64.
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None

    @field_validator("parameters")
    @classmethod
    def _schema(cls, v):
        if v is not None and v.get("type", "object") != "object":
            raise ValueError("a function's parameters are a JSON schema of type object")
        return v


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionDef


class _Name(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: _Name


class _CallFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1)
    arguments: str  # a JSON object, as a string (OpenAI's shape)


class ToolCall(BaseModel):
    """An earlier call in the history (an assistant message's ``tool_calls``)."""

    model_config = ConfigDict(extra="forbid")
    id: str
    type: Literal["function"]
    function: _CallFunction

    def for_template(self) -> dict | None:
        """The call as chat templates take it (transformers' convention, as vLLM passes it):
        the arguments as an object; None if they are not a JSON object."""
        try:
            args = json.loads(self.function.arguments)
        except ValueError:
            return None
        if not isinstance(args, dict):
            return None
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.function.name, "arguments": args},
        }


def check_tools(tools: list[Tool] | None, choice: str | NamedToolChoice | None) -> None:
    """No duplicate names, at most ``MAX_TOOLS``, and a ``tool_choice`` that names a given
    tool; ``required`` or a named function needs tools."""
    names = [t.function.name for t in tools or ()]
    if len(names) > MAX_TOOLS:
        raise field_error("tools", f"at most {MAX_TOOLS} tools per request, got {len(names)}")
    for i, name in enumerate(names):
        if name in names[:i]:
            raise field_error(f"tools[{i}]", f"tools[{i}] repeats the function name {name!r}")
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in names:
            raise field_error(
                "tool_choice",
                f"tool_choice names the function {choice.function.name!r}, which is not in "
                f"tools ({', '.join(names) or 'none given'})",
            )
    elif choice == "required" and not names:
        raise field_error("tool_choice", "tool_choice 'required' needs tools")


def _message_error(param: str, reason: str) -> ValueError:
    return ApiError(400, reason, param=param)


def template_messages(messages: list) -> list[dict]:
    """Messages as a chat template takes them. An assistant's tool calls carry their arguments
    as objects (transformers' convention), a tool message its ``tool_call_id``; content is
    required but for an assistant message with tool calls (None then, if not given)."""
    out = []
    for i, m in enumerate(messages):
        # "developer" is OpenAI's newer name for "system"; chat templates know only the latter.
        msg: dict = {"role": "system" if m.role == "developer" else m.role, "content": m.text}
        if m.tool_calls is not None:
            if m.role != "assistant":
                raise _message_error(
                    f"messages[{i}].tool_calls", "only an assistant message has tool_calls"
                )
            param = f"messages[{i}].tool_calls"
            msg["tool_calls"] = []
            for j, c in enumerate(m.tool_calls):
                if (call := c.for_template()) is None:
                    raise _message_error(
                        f"{param}[{j}].function.arguments",
                        f"{param}[{j}].function.arguments must be a JSON object as a string, "
                        f"got {c.function.arguments!r:.100}",
                    )
                msg["tool_calls"].append(call)
            if m.content is None:
                msg["content"] = None
        elif m.content is None:
            raise _message_error(
                f"messages[{i}].content", f"Missing required parameter: messages[{i}].content"
            )
        if m.role == "tool":
            if not m.tool_call_id:
                raise _message_error(
                    f"messages[{i}].tool_call_id", "a tool message needs tool_call_id"
                )
            msg["tool_call_id"] = m.tool_call_id
        elif m.tool_call_id is not None:
            raise _message_error(
                f"messages[{i}].tool_call_id", "only a tool message has tool_call_id"
            )
        out.append(msg)
    return out
