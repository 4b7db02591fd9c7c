"""Structured output through the official ``openai`` client against the router over real
in-process workers and against one worker's own server: response_format json_schema and
json_object, vLLM's structured_outputs (regex, choice) and guided_* aliases, streamed and not;
every output validates; a bad request is a 400 naming the field, never a 500."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

WORD = {"type": "string", "pattern": "^[a-z]{1,8}$"}
SCHEMA = {
    "type": "object",
    "properties": {
        "name": WORD,
        "level": {"enum": ["low", "mid", "high"]},
        "scores": {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 99},
            "maxItems": 3,
        },
        "owner": {
            "type": "object",
            "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 9}, "tag": WORD},
            "required": ["id", "tag"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "level", "scores", "owner"],
    "additionalProperties": False,
}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "record", "schema": SCHEMA}}
MESSAGES = [{"role": "user", "content": "Describe a record as JSON."}]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0, "seed": 7}])
def test_chat_json_schema_validates(client, stream, sampling):
    kw = {"model": "tiny", "messages": MESSAGES, "max_tokens": 300}
    kw["response_format"] = JSON_SCHEMA
    if stream:
        chunks = list(client.chat.completions.create(**kw, **sampling, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    else:
        r = client.chat.completions.create(**kw, **sampling)
        text, finish = r.choices[0].message.content, r.choices[0].finish_reason
    assert finish == "stop"
    jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("stream", [False, True])
def test_completion_json_schema_and_json_object(client, stream):
    # Any JSON object, from random weights, can run long (strings of any length): this prompt's
    # greedy object closes within 400 tokens on the tiny model (21 tokens).
    for fmt, prompt, check in (
        (JSON_SCHEMA, "JSON:", lambda v: jsonschema.validate(v, SCHEMA)),
        ({"type": "json_object"}, "a", lambda v: isinstance(v, dict) or pytest.fail(repr(v))),
    ):
        kw = {"model": "tiny", "prompt": prompt, "max_tokens": 400, "temperature": 0}
        if stream:
            chunks = list(
                client.completions.create(**kw, stream=True, extra_body={"response_format": fmt})
            )
            text = "".join(c.choices[0].text for c in chunks if c.choices)
        else:
            r = client.completions.create(**kw, extra_body={"response_format": fmt})
            text = r.choices[0].text
            assert r.choices[0].finish_reason == "stop"
        check(json.loads(text))


def test_regex_choice_and_the_guided_aliases(client):
    pattern = r"[A-Z]{2}-[0-9]{2,4}"
    choices = ["red", "green", "blue"]
    for seed in range(2):
        for extra, ok in (
            ({"structured_outputs": {"regex": pattern}}, lambda t: re.fullmatch(pattern, t)),
            ({"guided_regex": pattern}, lambda t: re.fullmatch(pattern, t)),
            ({"structured_outputs": {"choice": choices}}, lambda t: t in choices),
            ({"guided_choice": choices}, lambda t: t in choices),
            ({"guided_json": SCHEMA}, lambda t: jsonschema.validate(json.loads(t), SCHEMA) or True),
        ):
            r = client.completions.create(
                model="tiny", prompt="x", max_tokens=300, seed=seed, extra_body=extra
            )
            assert ok(r.choices[0].text), (extra, r.choices[0].text)
            c = client.chat.completions.create(
                model="tiny", messages=MESSAGES, max_tokens=300, seed=seed, extra_body=extra
            )
            assert ok(c.choices[0].message.content), (extra, c.choices[0].message.content)


@pytest.mark.parametrize(
    "extra, param",
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
                }
            },
            "response_format",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(("}},
                }
            },
            "response_format",
        ),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "bad name!"}}},
            "response_format",
        ),
        ({"structured_outputs": {"regex": "(unclosed"}}, "response_format"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_grammar": "start: missing_rule"}, "response_format"),
        ({"guided_choice": []}, "guided_choice"),
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_a_bad_request_is_a_400_naming_the_field(client, extra, param, stream):
    with pytest.raises(openai.BadRequestError) as e:
        r = client.completions.create(
            model="tiny", prompt="x", max_tokens=5, stream=stream, extra_body=extra
        )
        if stream:
            list(r)
    assert e.value.status_code == 400
    assert e.value.body["param"].split(".")[0] == param, e.value.body


# ---------------------------------------------------------------------- closed schemas


def _accepts(schema: dict, text: str) -> bool:
    """Whether the worker's grammar for ``schema``, as the edge sends it, takes ``text`` whole."""
    from radixray.api.schemas import ChatCompletionRequest
    from radixray.api.structured import ResponseFormat, grammar_spec
    from radixray.model_meta import load_model_meta
    from radixray.worker.grammar import GrammarCompiler

    body = ChatCompletionRequest.model_validate(
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": "x"}],
            "response_format": ResponseFormat.model_validate(
                {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
            ).model_dump(by_alias=True),
        }
    )
    spec = grammar_spec(body)
    tokenizer = load_model_meta("tiny").tokenizer
    matcher = GrammarCompiler(tokenizer).matcher(spec.kind, spec.spec)
    return all(matcher.accept(t) for t in tokenizer.encode(text)) and matcher.accepting


@pytest.mark.parametrize(
    "schema, text, ok",
    [
        # An object naming its properties takes no others unless it says so.
        ({"type": "object", "properties": {"a": {"type": "integer"}}}, '{"a":1}', True),
        ({"type": "object", "properties": {"a": {"type": "integer"}}}, '{"a":1,"b":2}', False),
        (
            {"type": "object", "properties": {"a": {}}, "additionalProperties": True},
            '{"a":1,"b":2}',
            True,
        ),
        (
            {
                "type": "object",
                "properties": {"a": {}},
                "additionalProperties": {"type": "string"},
            },
            '{"a":1,"b":"x"}',
            True,
        ),
        # Nested objects, items and $defs alike.
        (
            {"type": "array", "items": {"type": "object", "properties": {"x": {}}}},
            '[{"x":1,"y":2}]',
            False,
        ),
        (
            {
                "type": "object",
                "properties": {"p": {"$ref": "#/$defs/P"}},
                "$defs": {"P": {"type": "object", "properties": {"q": {}}}},
            },
            '{"p":{"q":1,"r":2}}',
            False,
        ),
        # An object that names no property is any object.
        ({"type": "object"}, '{"anything":[1,2]}', True),
        # prefixItems: nothing past them unless items says so.
        ({"type": "array", "prefixItems": [{"type": "integer"}]}, "[1]", True),
        ({"type": "array", "prefixItems": [{"type": "integer"}]}, "[1,2]", False),
        (
            {"type": "array", "prefixItems": [{"type": "integer"}], "items": {"type": "string"}},
            '[1,"a"]',
            True,
        ),
        # Properties spread over allOf's branches: each branch names only some of them.
        (
            {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]},
            '{"a":1,"b":2}',
            True,
        ),
    ],
)
def test_a_schema_that_says_nothing_of_extra_properties_allows_none(schema, text, ok):
    assert _accepts(schema, text) is ok
