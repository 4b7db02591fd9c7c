"""Structured output at the edge: the request fields that ask for it, checked for shape, turned
into the one ``GrammarSpec`` that crosses to the worker.

OpenAI's ``response_format`` (``text``, ``json_object``, ``json_schema``) and vLLM's extension
``structured_outputs`` (exactly one of ``json``, ``regex``, ``choice``, ``grammar``,
``json_object``), with vLLM's older ``guided_json`` / ``guided_regex`` / ``guided_choice`` /
``guided_grammar`` as aliases. At most one of them per request. The grammar itself is compiled
by the worker when it admits the request (the library is a worker dependency: the router never
imports it); a spec the library rejects comes back as a 400 naming ``response_format``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from radixray.protocol import GrammarSpec

from .errors import ApiError

__all__ = ["JsonSchemaFormat", "ResponseFormat", "StructuredOutputs", "grammar_spec"]

_ALIASES = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: str | None = None
    schema_: Annotated[dict[str, Any] | None, Field(alias="schema")] = None
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    json_: Annotated[dict[str, Any] | str | None, Field(alias="json")] = None
    regex: Annotated[str, Field(min_length=1)] | None = None
    choice: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] | None = None
    grammar: Annotated[str, Field(min_length=1)] | None = None
    json_object: bool | None = None


def _schema_text(value: dict | str, param: str) -> str:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ApiError(400, f"{param} is not valid JSON", param=param) from None
    if not isinstance(value, (dict, bool)):
        raise ApiError(400, f"{param} must be a JSON schema (an object)", param=param)
    return json.dumps(value)


def _from_structured(so: StructuredOutputs) -> GrammarSpec:
    given = [
        k
        for k, v in (
            ("json", so.json_),
            ("regex", so.regex),
            ("choice", so.choice),
            ("grammar", so.grammar),
            ("json_object", so.json_object or None),
        )
        if v is not None
    ]
    if len(given) != 1:
        raise ApiError(
            400,
            "structured_outputs takes exactly one of json, regex, choice, grammar, json_object",
            param="structured_outputs",
        )
    kind = given[0]
    if kind == "json":
        return GrammarSpec("json_schema", _schema_text(so.json_, "structured_outputs.json"))
    if kind == "choice":
        return GrammarSpec("choice", json.dumps(so.choice))
    if kind == "json_object":
        return GrammarSpec("json_object")
    return GrammarSpec(kind, getattr(so, kind))


def grammar_spec(body) -> GrammarSpec | None:
    """The GrammarSpec ``body`` asks for, or None; ApiError(400) naming the field otherwise."""
    sources = []
    rf: ResponseFormat | None = body.response_format
    if rf is not None and rf.type != "text":
        sources.append("response_format")
    if body.structured_outputs is not None:
        sources.append("structured_outputs")
    sources += [a for a in _ALIASES if getattr(body, a) is not None]
    if not sources:
        return None
    if len(sources) > 1:
        raise ApiError(
            400,
            f"ask for structured output once: {', '.join(sources)} were all given",
            param=sources[1],
        )
    src = sources[0]
    if src == "response_format":
        if rf.type == "json_object":
            return GrammarSpec("json_object")
        if rf.json_schema is None:
            raise ApiError(
                400,
                "response_format of type json_schema needs json_schema",
                param="response_format",
            )
        schema = rf.json_schema.schema_
        return GrammarSpec("json_schema", json.dumps(schema if schema is not None else {}))
    if src == "structured_outputs":
        return _from_structured(body.structured_outputs)
    value = getattr(body, src)
    if src == "guided_json":
        return GrammarSpec("json_schema", _schema_text(value, src))
    if src == "guided_choice":
        return GrammarSpec("choice", json.dumps(value))
    return GrammarSpec("regex" if src == "guided_regex" else "grammar", value)
