"""``tool_choice`` "required" and a named function, enforced by structured output: the answer is
constrained to tool calls in the template family's syntax (``tool_calls.py`` reads them back),
each call's arguments following its tool's ``parameters`` JSON schema, so the call always parses.

One llguidance Lark grammar (``GrammarSpec`` kind "grammar") per request: a rule per tool whose
body is a ``%json`` schema, ``{"name": <the tool's name>, <args key>: <its parameters>}``, wrapped
in the family's syntax:

- ``hermes`` (and every template without tool syntax): ``<tool_call>\\n{...}\\n</tool_call>``,
  calls separated by a newline;
- ``llama3_json``: the bare ``{"name": ..., "parameters": ...}``, calls separated by ``; ``.

"required" allows any of the tools, one call, or one or more unless ``parallel_tool_calls`` is
false; a named function allows exactly one call of that function. A function without
``parameters`` takes none (its arguments are ``{}``).
"""

from __future__ import annotations

import json

from radixray.protocol import GrammarSpec

from .structured import closed_schema
from .tool_schemas import NamedToolChoice, Tool

__all__ = ["tool_choice_grammar"]

# JSON as the families' own prompts write it ({"name": "f", "arguments": {...}}), with no room
# for free whitespace (a model that likes newlines cannot pad forever).
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}
_SYNTAX = {
    # family: (the arguments' key, a call's text before and after its JSON, between two calls)
    "hermes": ("arguments", "<tool_call>\n", "\n</tool_call>", "\n"),
    "llama3_json": ("parameters", "", "", "; "),
}


def _call_schema(tool: Tool, args_key: str) -> dict:
    """One call of ``tool`` as a JSON schema: its name, then its arguments. The parameters'
    own definitions move to the root, where their ``#/$defs/...`` references point."""
    params = closed_schema(tool.function.parameters or _NO_ARGUMENTS)
    defs = {k: params.pop(k) for k in ("$defs", "definitions") if k in params}
    params.pop("$schema", None)
    return {
        "type": "object",
        "properties": {"name": {"const": tool.function.name}, args_key: params},
        "required": ["name", args_key],
        "additionalProperties": False,
        **defs,
        "x-guidance": _JSON_STYLE,
    }


def tool_choice_grammar(
    tools: list[Tool] | None,
    choice: str | NamedToolChoice | None,
    family: str | None,
    parallel: bool = True,
) -> GrammarSpec | None:
    """The grammar that forces ``choice`` ("required" or a named function) over ``tools`` in
    ``family``'s syntax (``ChatTemplate.tool_family``; None is Hermes); None for any other
    choice (``auto``, ``none``, not given), which the model answers freely."""
    if not tools:
        return None
    if isinstance(choice, NamedToolChoice):
        tools = [t for t in tools if t.function.name == choice.function.name]
        parallel = False
    elif choice != "required":
        return None
    args_key, before, after, between = _SYNTAX[family or "hermes"]
    lines = [
        "start: call" + (f" ({json.dumps(between)} call)*" if parallel else ""),
        f"call: {json.dumps(before)} body {json.dumps(after)}" if before else "call: body",
        "body: " + " | ".join(f"fn{i}" for i in range(len(tools))),
    ]
    lines += [f"fn{i}: %json {json.dumps(_call_schema(t, args_key))}" for i, t in enumerate(tools)]
    return GrammarSpec("grammar", "\n".join(lines) + "\n")
