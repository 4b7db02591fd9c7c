"""Structured output on the engine (the tiny model, random weights: the grammar alone must make
every output valid), greedy and seeded-sampled, batched with free rows; the bitmask apply; a
spec the library rejects."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from radixray.protocol import GrammarSpec, InvalidRequest, SamplingParams
from radixray.worker import Engine, EngineConfig
from radixray.worker.sampler import apply_token_bitmask

SHORT = {"type": "string", "pattern": "^[a-z]{1,6}$"}
SCHEMAS = {
    "flat_enum": {
        "type": "object",
        "properties": {"role": {"enum": ["admin", "user", "guest"]}, "ok": {"type": "boolean"}},
        "required": ["role", "ok"],
        "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "name": SHORT,
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "address": {
                "type": "object",
                "properties": {"city": SHORT, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "age", "address"],
        "additionalProperties": False,
    },
    "arrays": {
        "type": "object",
        "properties": {
            "tags": {
                "type": "array",
                "items": {"enum": ["a", "b", "c"]},
                "minItems": 1,
                "maxItems": 4,
            },
            "points": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9}},
                    "required": ["x"],
                    "additionalProperties": False,
                },
                "maxItems": 3,
            },
        },
        "required": ["tags", "points"],
        "additionalProperties": False,
    },
    "top_array": {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 5},
}
PROMPTS = ["Give me JSON:", "hello world", "{"]


@pytest.fixture(scope="module")
def engine():
    return Engine(EngineConfig(model="tiny", page_size=4, device="cpu", seed=0))


def _grammar(schema) -> GrammarSpec:
    return GrammarSpec("json_schema", json.dumps(schema))


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_greedy_and_sampled_output_validates(engine, name):
    schema = SCHEMAS[name]
    greedy = SamplingParams(max_tokens=300, temperature=0.0, grammar=_grammar(schema))
    sampled = [
        SamplingParams(max_tokens=300, temperature=1.0, seed=s, grammar=_grammar(schema))
        for s in range(4)
    ]
    prompts = PROMPTS + [PROMPTS[0]] * 4
    outs = engine.generate_batch(prompts, [greedy] * len(PROMPTS) + sampled)
    for out in outs:
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), schema)
    # seeded samples repeat
    again = engine.generate_batch([PROMPTS[0]], [sampled[1]])[0]
    assert again.token_ids == outs[len(PROMPTS) + 1].token_ids


def test_grammar_rows_beside_free_rows_leave_the_free_rows_as_they_were(engine):
    free = SamplingParams(max_tokens=12, temperature=0.0)
    alone = engine.generate_batch(["abc"], [free])[0]
    mixed = engine.generate_batch(
        ["abc", "x"],
        [
            free,
            SamplingParams(max_tokens=200, temperature=0, grammar=_grammar(SCHEMAS["flat_enum"])),
        ],
    )
    assert mixed[0].token_ids == alone.token_ids
    jsonschema.validate(json.loads(mixed[1].text), SCHEMAS["flat_enum"])


def test_json_object_regex_and_choice(engine):
    obj = engine.generate_batch(
        ["x"], [SamplingParams(max_tokens=400, temperature=0, grammar=GrammarSpec("json_object"))]
    )[0]
    assert obj.finish_reason == "stop"
    assert isinstance(json.loads(obj.text), dict)
    pattern = r"[A-Z][a-z]{2,5}-[0-9]{3}"
    for seed in range(3):
        p = SamplingParams(max_tokens=50, seed=seed, grammar=GrammarSpec("regex", pattern))
        out = engine.generate_batch(["id:"], [p])[0]
        assert re.fullmatch(pattern, out.text), out.text
    choices = ["yes", "no", "maybe later"]
    for seed in range(3):
        p = SamplingParams(
            max_tokens=50, seed=seed, grammar=GrammarSpec("choice", json.dumps(choices))
        )
        assert engine.generate_batch(["?"], [p])[0].text in choices


def test_lark_grammar(engine):
    lark = 'start: "(" num ("," num)? ("," num)? ")"\nnum: /[0-9]{1,2}/'
    out = engine.generate_batch(
        ["t"], [SamplingParams(max_tokens=60, temperature=0, grammar=GrammarSpec("grammar", lark))]
    )[0]
    assert re.fullmatch(r"\([0-9]{1,2}(,[0-9]{1,2}){0,2}\)", out.text), out.text


@pytest.mark.parametrize(
    "spec",
    [
        GrammarSpec("json_schema", "{not json"),
        GrammarSpec(
            "json_schema", json.dumps({"type": "object", "properties": {"a": {"type": "nonsense"}}})
        ),
        GrammarSpec("regex", "(unclosed"),
        GrammarSpec("grammar", "start: undefined_rule"),
    ],
)
def test_a_spec_the_library_rejects_is_invalid_request_naming_response_format(engine, spec):
    with pytest.raises(InvalidRequest) as e:
        engine.add_request("x", SamplingParams(max_tokens=4, grammar=spec))
    assert e.value.param == "response_format"
    assert not engine.has_work()


def test_grammar_kind_is_checked_on_the_message():
    with pytest.raises(InvalidRequest) as e:
        GrammarSpec("yaml", "")
    assert e.value.param == "response_format"


def test_apply_token_bitmask_masks_only_the_given_rows():
    logits = torch.zeros(3, 40)
    mask = torch.zeros(1, 2, dtype=torch.int32)
    mask[0, 0] = (1 << 3) - (1 << 31)  # ids 3 and 31 (bit 31: the sign bit of an int32)
    mask[0, 1] = 1 << 2  # id 34
    apply_token_bitmask(logits, mask, [1])
    assert torch.isinf(logits[1]).sum() == 37
    assert logits[1, [3, 31, 34]].tolist() == [0.0, 0.0, 0.0]
    assert not torch.isinf(logits[0]).any() and not torch.isinf(logits[2]).any()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_min_tokens_past_the_grammars_end_lets_the_grammar_win(engine, temperature):
    choices = ["ok", "no"]
    spec = GrammarSpec("choice", json.dumps(choices))
    p = SamplingParams(max_tokens=20, min_tokens=10, temperature=temperature, seed=1, grammar=spec)
    out = engine.generate_batch(["?"], [p])[0]
    assert out.text in choices and out.finish_reason == "stop"


def test_a_row_left_empty_by_the_controls_gets_the_grammars_tokens():
    logits = torch.zeros(2, 40)
    logits[1, 5] = float("-inf")  # the only id the grammar allows, held back by a control
    mask = torch.zeros(1, 2, dtype=torch.int32)
    mask[0, 0] = 1 << 5
    apply_token_bitmask(logits, mask, [1])
    assert logits[1].argmax() == 5 and torch.isinf(logits[1]).sum() == 39
    assert not torch.isinf(logits[0]).any()


def test_the_grammar_crosses_the_codec_and_a_bad_kind_does_not():
    import msgspec

    from radixray.protocol.codec import ProtocolError, decode, encode
    from radixray.protocol.messages import GenerateRequest

    p = SamplingParams(max_tokens=4, grammar=GrammarSpec("regex", "[a-z]+"))
    req = GenerateRequest("r1", [1, 2, 3], p)
    assert decode(encode(req), GenerateRequest).params == p
    raw = msgspec.msgpack.decode(encode(req))  # [tag, request_id, prompt_ids, params, ...]
    assert raw[3][-2] == ["regex", "[a-z]+"]  # position 19 (n follows): the order is the protocol
    raw[3][-2] = ["yaml", ""]
    with pytest.raises((ProtocolError, InvalidRequest)):
        decode(msgspec.msgpack.encode(raw), GenerateRequest)
