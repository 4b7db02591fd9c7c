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

__all__ = [
    "JsonSchemaFormat",
    "ResponseFormat",
    "StructuredOutputs",
    "closed_schema",
    "grammar_spec",
]

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
    return json.dumps(closed_schema(value))


# Keywords whose value is one subschema, a list of alternatives, or a map of named subschemas.
_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains")
_ALTERNATIVES = ("anyOf", "oneOf")
_NAMED = ("properties", "$defs", "definitions", "patternProperties")


def closed_schema(schema):
    """``schema`` with no properties beyond those it names: an object schema that names its
    ``properties`` and says nothing of ``additionalProperties`` gets ``false`` there, and an
    array schema with ``prefixItems`` and no ``items`` gets no items past them (xgrammar's
    default strict mode, what OpenAI's strict mode asks for, and what libraries built on these
    APIs assume). Kept open: an explicit ``additionalProperties`` / ``items``; an object that
    names no property (``{"type": "object"}``, any object); and where an object's properties
    are spread over parts (an ``allOf``'s branches, or ``properties`` beside ``anyOf`` /
    ``oneOf`` branches that name more), those parts, since each names only some of them.
    Returns a new schema; ``schema`` is not changed."""
    return _close(schema, True)


def _names_properties(schema) -> bool:
    return isinstance(schema, dict) and isinstance(schema.get("properties"), dict)


def _close(schema, close_here: bool):
    if isinstance(schema, list):
        return [_close(s, True) for s in schema]
    if not isinstance(schema, dict):
        return schema
    own = _names_properties(schema)
    parts = [
        b
        for k in ("allOf", *_ALTERNATIVES)
        if isinstance(schema.get(k), list)
        for b in schema[k]
        if _names_properties(b)
    ]
    spread = own and bool(parts)  # properties named here and in branches: close neither
    out = {}
    for key, value in schema.items():
        if key in _NAMED and isinstance(value, dict):
            out[key] = {name: _close(sub, True) for name, sub in value.items()}
        elif key in _ALTERNATIVES and isinstance(value, list):
            out[key] = [_close(b, not spread) for b in value]
        elif key == "allOf" and isinstance(value, list):
            out[key] = [_close(b, False) for b in value]
        elif key in _ONE or key == "prefixItems":
            out[key] = _close(value, True)
        else:
            out[key] = value
    if close_here and not spread:
        if own and not _says(schema, "Properties"):
            out["additionalProperties"] = False
        if isinstance(schema.get("prefixItems"), list) and not _says(schema, "Items", "items"):
            out["items"] = False
    return out


def _says(schema: dict, what: str, *more: str) -> bool:
    """Whether ``schema`` itself bounds its extra properties (or items)."""
    return any(k in schema for k in (f"additional{what}", f"unevaluated{what}", *more))


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
        return GrammarSpec("json_schema", json.dumps(closed_schema(schema or {})))
    if src == "structured_outputs":
        return _from_structured(body.structured_outputs)
    value = getattr(body, src)
    if src == "guided_json":
        return GrammarSpec("json_schema", _schema_text(value, src))
    if src == "guided_choice":
        return GrammarSpec("choice", json.dumps(value))
    return GrammarSpec("regex" if src == "guided_regex" else "grammar", value)
