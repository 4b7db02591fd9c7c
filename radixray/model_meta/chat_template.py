"""Chat templates: the Jinja source a checkpoint ships, rendered the way HF transformers does.

Rendering settings follow transformers' ``apply_chat_template`` (a sandboxed environment with
``trim_blocks`` and ``lstrip_blocks``, ``raise_exception`` and ``strftime_now`` globals, the
``loopcontrols`` extension) so that the same template gives the same text, token for token.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

__all__ = ["CHATML", "ChatTemplate", "tool_family"]

# Plain ChatML without a default system prompt: what the tiny test tokenizer uses.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ChatTemplateError(ValueError):
    """The template called ``raise_exception`` (e.g. roles out of order)."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **kw: Any) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, **kw)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def _compile(source: str):
    # jinja2 comes with torch (a hard dependency of torch), so it is always importable here.
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


class ChatTemplate:
    """A compiled chat template plus the special-token strings templates may refer to."""

    def __init__(self, source: str, special_tokens: Mapping[str, str] | None = None) -> None:
        if not isinstance(source, str) or not source.strip():
            raise ValueError("ChatTemplate needs a non-empty Jinja template string")
        self.source = source
        self._special = dict(special_tokens or {})
        self._template = _compile(source)

        self.tool_family = tool_family(source)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **extra: Any,
    ) -> str:
        """Render ``messages`` (``[{"role": ..., "content": ...}, ...]``) to the prompt text.

        ``tools`` (OpenAI function tools) and structured messages (an assistant's
        ``tool_calls``, ``tool`` results) go to the template as transformers passes them. A
        template with no tool syntax gets them in Hermes's format instead (``hermes_messages``):
        the tools in the system message, calls and results as text in their turns."""
        if isinstance(messages, (str, bytes)) or not all(
            isinstance(m, Mapping) and "role" in m and "content" in m for m in messages
        ):
            raise ValueError(
                "messages must be a list of {'role': str, 'content': str} mappings, "
                f"got {messages!r:.200}"
            )
        messages = [dict(m) for m in messages]
        if self.tool_family is None and (tools or _has_tool_turns(messages)):
            messages, tools = hermes_messages(messages, tools), None
        if tools:
            extra["tools"] = [dict(t) for t in tools]
        return self._template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            **self._special,
            **extra,
        )


def tool_family(source: str) -> str | None:
    """How a template writes tool calls, which names the parser of a model's answers:
    ``"llama3_json"`` (Llama 3.1's bare JSON with ``parameters``), ``"hermes"`` (Qwen2.5's and
    Hermes's ``<tool_call>`` JSON), or None: the template has no tool syntax (ChatML, SmolLM2's),
    so tools are rendered in Hermes's format by us and answers read by the Hermes parser."""
    if "tools" not in source:
        return None
    if "<|start_header_id|>" in source and "parameters" in source:
        return "llama3_json"
    return "hermes"


def _has_tool_turns(messages: list[dict]) -> bool:
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


# Hermes's tool prompt, as Qwen2.5's template writes it (tests/data/chat_templates/).
_HERMES_TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_HERMES_TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def hermes_tools_prompt(tools: Sequence[Mapping[str, Any]]) -> str:
    """The tools block of the system message, each tool as one JSON line (Qwen2.5's)."""
    lines = "".join("\n" + _tojson(dict(t)) for t in tools)
    return _HERMES_TOOLS_HEAD + lines + _HERMES_TOOLS_TAIL


def hermes_call(call: Mapping[str, Any]) -> str:
    """One earlier tool call as the model writes it: ``<tool_call>\n{json}\n</tool_call>``."""
    fn = call.get("function", call)
    return (
        '<tool_call>\n{"name": "'
        + fn["name"]
        + '", "arguments": '
        + _tojson(fn.get("arguments"))
        + "}\n</tool_call>"
    )


def hermes_messages(messages: list[dict], tools: Sequence[Mapping[str, Any]] | None) -> list[dict]:
    """Messages with tools, calls and results written as text, for a template without tool
    syntax, the way Qwen2.5's template writes them: the tools prompt after the system
    message's text (a system message of its own if there is none), an assistant's calls after
    its text, one line apart, and a run of tool results as one user turn of
    ``<tool_response>`` blocks."""
    out: list[dict] = []
    for m in messages:
        role = m.get("role")
        if role == "assistant" and m.get("tool_calls"):
            parts = [m["content"]] if m.get("content") else []
            parts += [hermes_call(c) for c in m["tool_calls"]]
            out.append({"role": "assistant", "content": "\n".join(parts)})
        elif role == "tool":
            block = "<tool_response>\n" + (m.get("content") or "") + "\n</tool_response>"
            if out and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_results": True})
        else:
            out.append({k: v for k, v in m.items() if k != "tool_call_id"})
    for m in out:
        m.pop("_tool_results", None)
    if tools:
        prompt = hermes_tools_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + prompt}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out
