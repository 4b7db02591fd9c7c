"""A battery of bad requests: each gets a 4xx in OpenAI's error shape naming the parameter;
nothing is a 5xx, nothing crashes, and the workers are left clean."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .serving import LiveServer, inprocess_service

C = "/v1/completions"
CH = "/v1/chat/completions"
R = "/v1/responses"
OK_MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def url():
    service, hosts, clients = inprocess_service(2, max_tokens_limit=64)
    with LiveServer(service, clients) as u:
        yield u
    for h in hosts:
        assert h.engine.cache.protected_tokens == 0
        h.engine.check_integrity()
        h.shutdown()


@pytest.fixture(scope="module")
def http(url):
    """One keep-alive client for the battery (a client per request costs more than the
    request)."""
    with httpx.Client(timeout=30) as client:
        yield client


def comp(**kw):
    return {"model": "tiny", "prompt": "x"} | kw


def chat(**kw):
    return {"model": "tiny", "messages": OK_MSG} | kw


def resp(**kw):
    return {"model": "tiny", "input": "x"} | kw


def _fmt(schema) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def _nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def _tool(parameters: dict | None = None, name: str = "f") -> dict:
    fn = {"name": name} | ({"parameters": parameters} if parameters is not None else {})
    return {"type": "function", "function": fn}


_TOOL = _tool()


CASES = [
    # (route, body, status, param)
    (C, comp(max_tokens=0), 400, "max_tokens"),
    (C, comp(max_tokens=-5), 400, "max_tokens"),
    (C, comp(max_tokens="ten"), 400, "max_tokens"),
    (C, comp(max_tokens=1.5), 400, "max_tokens"),
    (C, comp(max_tokens=10**6), 400, "max_tokens"),
    (C, comp(max_tokens=65), 400, "max_tokens"),
    (C, comp(temperature=5), 400, "temperature"),
    (C, comp(temperature=-1), 400, "temperature"),
    (C, comp(temperature="hot"), 400, "temperature"),
    (C, comp(top_p=0), 400, "top_p"),
    (C, comp(top_p=1.5), 400, "top_p"),
    (C, comp(prompt=""), 400, "prompt"),
    (C, {"model": "tiny"}, 400, "prompt"),
    (C, comp(prompt=[]), 400, "prompt"),
    (C, comp(prompt=[1, 99999]), 400, "prompt"),
    (C, comp(prompt=[-1]), 400, "prompt"),
    (C, comp(prompt=[1, -3_000_000_000]), 400, "prompt"),
    (C, comp(prompt=[1, 2**40]), 400, "prompt"),
    # A list of prompts: every element named by its index.
    (C, comp(prompt=["a", 1]), 400, "prompt[1]"),
    (C, comp(prompt=[1, "a"]), 400, "prompt[1]"),
    (C, comp(prompt=[[1], "a"]), 400, "prompt[1]"),
    (C, comp(prompt=["a", ""]), 400, "prompt[1]"),
    (C, comp(prompt=[[1, 2], []]), 400, "prompt[1]"),
    (C, comp(prompt=[[1, 2], [3, 99999]]), 400, "prompt[1]"),
    (C, comp(prompt=[[1, 2], [3, -1]]), 400, "prompt[1]"),
    (C, comp(prompt=[[1, 2], [3, 2.5]]), 400, "prompt[1]"),
    (C, comp(prompt=[None]), 400, "prompt[0]"),
    (C, comp(prompt=[{"x": 1}]), 400, "prompt[0]"),
    (C, comp(prompt=[True]), 400, "prompt[0]"),
    (C, comp(prompt=[[]]), 400, "prompt[0]"),
    (C, comp(prompt=["x"] * 257), 400, "prompt"),
    (C, comp(prompt=["a", "z" * 5000]), 400, "prompt[1]"),
    (C, comp(prompt=["a", "b"], max_tokens=65), 400, "max_tokens"),
    (C, comp(suffix="tail"), 400, "suffix"),
    (C, comp(prompt=["a", "b"], best_of=3), 400, "best_of"),
    (C, comp(best_of=0), 400, "best_of"),
    (C, comp(prompt=123), 400, "prompt"),
    (C, comp(prompt={"x": 1}), 400, "prompt"),
    (C, comp(prompt="z" * 5000), 400, "prompt"),
    (C, {"prompt": "x"}, 400, "model"),
    (C, comp(model="nope"), 404, "model"),
    (C, comp(model=5), 400, "model"),
    (C, comp(frobnicate=1), 400, "frobnicate"),
    (C, comp(stop=["a", "b", "c", "d", "e"]), 400, "stop"),
    (C, comp(stop=[""]), 400, "stop"),
    (C, comp(stop=123), 400, "stop"),
    (C, comp(n=129), 400, "n"),
    (C, comp(n=0), 400, "n"),
    (C, comp(stream="yes"), 400, "stream"),
    (C, comp(seed="x"), 400, "seed"),
    (C, comp(seed=1.5), 400, "seed"),
    (C, comp(echo="yes"), 400, "echo"),
    (C, comp(logprobs=6), 400, "logprobs"),
    (C, comp(logprobs=-1), 400, "logprobs"),
    (C, comp(logprobs=True), 400, "logprobs"),
    (C, comp(best_of=2), 400, "best_of"),
    (C, comp(presence_penalty=2.5), 400, "presence_penalty"),
    (C, comp(presence_penalty="x"), 400, "presence_penalty"),
    (C, comp(frequency_penalty=-2.01), 400, "frequency_penalty"),
    (C, comp(repetition_penalty=0), 400, "repetition_penalty"),
    (C, comp(repetition_penalty=-1), 400, "repetition_penalty"),
    (C, comp(min_p=1.5), 400, "min_p"),
    (C, comp(min_p=-0.1), 400, "min_p"),
    (C, comp(top_k=-2), 400, "top_k"),
    (C, comp(top_k=2.5), 400, "top_k"),
    (C, comp(logit_bias={"5": 101}), 400, "logit_bias"),
    (C, comp(logit_bias={"abc": 1}), 400, "logit_bias"),
    (C, comp(logit_bias={"-1": 1}), 400, "logit_bias"),
    (C, comp(logit_bias={"99999": 1}), 400, "logit_bias"),
    (C, comp(logit_bias=[1, 2]), 400, "logit_bias"),
    (C, comp(min_tokens=-1), 400, "min_tokens"),
    (C, comp(min_tokens=5, max_tokens=4), 400, "min_tokens"),
    (C, comp(min_tokens=65), 400, "min_tokens"),
    (C, comp(stop_token_ids=[-1]), 400, "stop_token_ids[0]"),
    (C, comp(stop_token_ids=[99999]), 400, "stop_token_ids"),
    (C, comp(stop_token_ids=3), 400, "stop_token_ids"),
    (C, comp(stream_options={"foo": 1}), 400, "stream_options"),
    (C, comp(user=5), 400, "user"),
    (CH, chat(messages=[]), 400, "messages"),
    (CH, chat(logprobs=True, top_logprobs=21), 400, "top_logprobs"),
    (CH, chat(top_logprobs=2), 400, "top_logprobs"),
    (CH, chat(logprobs=1), 400, "logprobs"),
    (CH, chat(messages="hi"), 400, "messages"),
    (CH, chat(messages=[1]), 400, "messages[0]"),
    (CH, chat(messages=[{"role": "wizard", "content": "x"}]), 400, "messages[0].role"),
    (CH, chat(messages=[{"role": "user"}]), 400, "messages[0].content"),
    (CH, chat(messages=[{"content": "x"}]), 400, "messages[0].role"),
    (CH, chat(messages=[{"role": "user", "content": 5}]), 400, "messages[0].content"),
    (CH, chat(messages=[{"role": "user", "content": "x", "extra": 1}]), 400, "messages[0].extra"),
    (
        CH,
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "url": "x"}]}]),
        400,
        "messages[0].content",
    ),
    (CH, chat(max_completion_tokens=0), 400, "max_completion_tokens"),
    (CH, chat(max_tokens=10**9), 400, "max_tokens"),
    (CH, chat(model="nope"), 404, "model"),
    (CH, chat(messages=[{"role": "user", "content": "y" * 5000}]), 400, "messages"),
    (CH, chat(temperature=3), 400, "temperature"),
    (CH, chat(stop=[""]), 400, "stop"),
    (CH, chat(tools=[]), 400, "tools"),
    (CH, chat(frequency_penalty=3), 400, "frequency_penalty"),
    (CH, chat(logit_bias={"1": -100.5}), 400, "logit_bias"),
    (CH, chat(min_tokens=9, max_completion_tokens=8), 400, "min_tokens"),
    (CH, chat(stop_token_ids=[2**40]), 400, "stop_token_ids"),
    # Logprobs: OpenAI's ranges (completions 0-5, chat top_logprobs 0-20 with logprobs true).
    (C, comp(logprobs=2.5), 400, "logprobs"),
    (C, comp(logprobs="5"), 400, "logprobs"),
    (C, comp(echo=True, logprobs=6), 400, "logprobs"),
    (C, comp(echo=True, logprobs=-1), 400, "logprobs"),
    (CH, chat(logprobs=True, top_logprobs=-1), 400, "top_logprobs"),
    (CH, chat(logprobs=True, top_logprobs=2.5), 400, "top_logprobs"),
    (CH, chat(logprobs=True, top_logprobs="3"), 400, "top_logprobs"),
    (CH, chat(logprobs="yes"), 400, "logprobs"),
    (CH, chat(logprobs=False, top_logprobs=3), 400, "top_logprobs"),
    # logit_bias: keys are token ids in the vocabulary, values numbers in [-100, 100].
    (CH, chat(logit_bias={"1.5": 1}), 400, "logit_bias"),
    (CH, chat(logit_bias={"": 1}), 400, "logit_bias"),
    (CH, chat(logit_bias={"1": "x"}), 400, "logit_bias.1"),
    (CH, chat(logit_bias={"1": None}), 400, "logit_bias.1"),
    (CH, chat(logit_bias={"1": True}), 400, "logit_bias.1"),
    (CH, chat(logit_bias={"1": "5"}), 400, "logit_bias.1"),
    (CH, chat(logit_bias={"1": 1e308}), 400, "logit_bias"),
    (CH, chat(logit_bias={str(2**64): 1}), 400, "logit_bias"),
    (CH, chat(logit_bias="x"), 400, "logit_bias"),
    # response_format: malformed, or a schema the grammar library rejects (on the worker):
    # a 400 naming response_format, never a 5xx or a hang.
    (CH, chat(response_format={"type": "yaml"}), 400, "response_format.type"),
    (CH, chat(response_format="json"), 400, "response_format"),
    (CH, chat(response_format={"type": "json_schema"}), 400, "response_format"),
    (CH, chat(response_format=_fmt({"type": "nonsense"})), 400, "response_format"),
    (CH, chat(response_format=_fmt({"type": "string", "pattern": "(("})), 400, "response_format"),
    (CH, chat(response_format=_fmt({"$ref": "#/$defs/missing"})), 400, "response_format"),
    (CH, chat(response_format=_fmt({"type": "object", "required": 5})), 400, "response_format"),
    (
        CH,
        chat(response_format=_fmt({"type": "integer", "minimum": 5, "maximum": 1})),
        400,
        "response_format",
    ),
    (C, comp(response_format=_fmt({"type": "nonsense"})), 400, "response_format"),
    (C, comp(response_format=_fmt({"enum": []})), 400, "response_format"),
    # tools: malformed, and a tool_choice naming no given function.
    (CH, chat(tools=[{"type": "function"}]), 400, "tools[0].function"),
    (CH, chat(tools=[{"type": "retrieval", "function": {"name": "f"}}]), 400, "tools[0].type"),
    (
        CH,
        chat(tools=[{"type": "function", "function": {"name": "a b"}}]),
        400,
        "tools[0].function.name",
    ),
    (
        CH,
        chat(tools=[{"type": "function", "function": {"name": "f", "parameters": 5}}]),
        400,
        "tools[0].function.parameters",
    ),
    (CH, chat(tools=[_TOOL, _TOOL]), 400, "tools[1]"),
    (CH, chat(tools="f"), 400, "tools"),
    (
        CH,
        chat(tools=[_TOOL], tool_choice={"type": "function", "function": {"name": "g"}}),
        400,
        "tool_choice",
    ),
    (CH, chat(tool_choice={"type": "function", "function": {"name": "f"}}), 400, "tool_choice"),
    (CH, chat(tool_choice="required"), 400, "tool_choice"),
    (CH, chat(tools=[_TOOL], tool_choice="sometimes"), 400, "tool_choice"),
    (
        CH,
        chat(tools=[_TOOL], tool_choice="required", response_format={"type": "json_object"}),
        400,
        "tool_choice",
    ),
    # stop_token_ids and min_tokens on chat too.
    (CH, chat(stop_token_ids=[5, -1]), 400, "stop_token_ids[1]"),
    (CH, chat(min_tokens=5, max_tokens=4), 400, "min_tokens"),
    # Discovery: vLLM's /tokenize and /detokenize.
    ("/tokenize", {}, 400, "prompt"),
    ("/tokenize", {"prompt": "x", "messages": OK_MSG}, 400, "prompt"),
    ("/tokenize", {"prompt": 5}, 400, "prompt"),
    ("/tokenize", {"prompt": "x", "model": "nope"}, 404, "model"),
    ("/tokenize", {"prompt": "x", "add_generation_prompt": True}, 400, "add_generation_prompt"),
    ("/tokenize", {"prompt": "x", "add_special_tokens": "yes"}, 400, "add_special_tokens"),
    ("/tokenize", {"prompt": "x", "frobnicate": 1}, 400, "frobnicate"),
    ("/tokenize", {"messages": []}, 400, "messages"),
    ("/tokenize", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
    ("/detokenize", {}, 400, "tokens"),
    ("/detokenize", {"tokens": "ab"}, 400, "tokens"),
    ("/detokenize", {"tokens": [1, "a"]}, 400, "tokens[1]"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("/detokenize", {"tokens": [1, 99999]}, 400, "tokens"),
    ("/detokenize", {"tokens": [1], "model": "nope"}, 404, "model"),
    (R, resp(input=5), 400, "input"),
    (R, resp(input=[5]), 400, "input[0]"),
    (R, resp(input=[{"type": "message", "role": "user", "content": 3}]), 400, "input[0].content"),
    (
        R,
        resp(input=[{"role": "user", "content": [{"type": "x"}]}]),
        400,
        "input[0].content[0].type",
    ),
    (R, resp(tools=[{"type": "code_interpreter"}]), 400, "tools[0].type"),
    (
        R,
        resp(tools=[{"type": "function", "name": "f", "parameters": {"type": "array"}}]),
        400,
        "tools[0].parameters",
    ),
    (R, resp(tools=[{"type": "function", "name": "f"}] * 2), 400, "tools[1]"),
    (
        R,
        resp(
            tool_choice={"type": "function", "name": "g"}, tools=[{"type": "function", "name": "f"}]
        ),
        400,
        "tool_choice",
    ),
    (R, resp(tool_choice={"type": "function"}), 400, "tool_choice.name"),
    (R, resp(text={"format": {"type": "yaml"}}), 400, "text.format"),
    (
        R,
        resp(text={"format": {"type": "json_schema", "name": "n", "schema": {"type": "nonsense"}}}),
        400,
        "text.format",
    ),
    (R, resp(max_output_tokens=65), 400, "max_output_tokens"),
    (R, resp(store="yes"), 400, "store"),
    (R, resp(background=True), 400, "background"),
    (R, resp(metadata={"a": 1}), 400, "metadata.a"),
    (R, resp(previous_response_id="resp_00000000_0"), 404, "previous_response_id"),
    (R, resp(model="nope"), 404, "model"),
    (R, resp(prompt={"id": "pmpt_1"}), 400, "prompt"),
]


@pytest.mark.parametrize(
    ("route", "body", "status", "param"), CASES, ids=[f"{i}-{c[3]}" for i, c in enumerate(CASES)]
)
def test_bad_request_names_the_parameter(url, http, route, body, status, param):
    r = http.post(url + route, json=body, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    assert err["message"] and err["type"]


# A tool whose parameters the grammar library rejects, under a tool_choice that compiles them.
_BAD_TOOL = chat(
    tools=[_tool({"type": "object", "properties": {"a": {"type": "nonsense"}}})],
    tool_choice="required",
)


def test_tool_parameters_the_grammar_library_rejects_are_a_400(url, http):
    # named tools: the grammar the worker refused is the one that forces the tool calls
    r = http.post(url + CH, json=_BAD_TOOL, timeout=30)
    assert r.status_code == 400 and "nonsense" in r.json()["error"]["message"], r.text
    assert r.json()["error"]["param"] == "tools"


def test_deep_schemas_are_400s_or_served(url, http):
    """A schema nested past the JSON parser's depth is refused as the body; one past the grammar
    library's is a 400 naming response_format; one within both is served. Never a 5xx."""
    r = http.post(url + CH, json=chat(response_format=_fmt(_nested(300))), timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json", r.text
    r = http.post(url + CH, json=chat(response_format=_fmt(_nested(80))), timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text
    assert "recursion" in r.json()["error"]["message"]
    body = chat(response_format=_fmt(_nested(60)), max_tokens=8)
    r = http.post(url + CH, json=body, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"].startswith('{"a"')


RAW = [
    (b"{not json", 400),
    (b'{"model": "tiny", "prompt": "\xff\xfe"}', 400),
    (b"[1, 2, 3]", 400),
    (b"", 400),
    (b"null", 400),
    # JSON has no infinities nor NaN: a parser that reads them must not let them through.
    (b'{"model": "tiny", "prompt": "x", "logit_bias": {"1": Infinity}}', 400),
    (b'{"model": "tiny", "prompt": "x", "logit_bias": {"1": NaN}}', 400),
    (b'{"model": "tiny", "prompt": "x", "temperature": NaN}', 400),
    (b'{"model": "tiny", "prompt": "x", "presence_penalty": -Infinity}', 400),
]


@pytest.mark.parametrize(("raw", "status"), RAW)
def test_bad_bodies(url, http, raw, status):
    r = http.post(url + C, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert "error" in r.json()


def test_oversized_body_and_unknown_route_and_method(url, http):
    r = httpx.post(  # a connection of its own: the server may close it before reading it all
        url + C, content=b"x" * (4 << 20 + 1), headers={"content-type": "application/json"}
    )
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]
    r = http.get(url + "/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = http.get(url + C)
    assert r.status_code == 405 and "error" in r.json()
    r = http.get(url + "/tokenize")
    assert r.status_code == 405 and "error" in r.json()


# Values of every kind for the sampling controls: in range, at the edges, out of range, of the
# wrong type. Each request is served (200) or refused (400 naming a field), never a 5xx.
_ANY = (
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)  # JSON has neither
    | st.text(max_size=4)
    | st.lists(st.integers(-5, 300), max_size=3)
)
_TOKEN = st.integers(-2, 300) | st.sampled_from([2**31, 99999, 258])
_CONTROLS = {
    "top_k": st.integers(-3, 300) | _ANY,
    "min_p": st.floats(-0.5, 1.5) | _ANY,
    "presence_penalty": st.floats(-3, 3) | _ANY,
    "frequency_penalty": st.floats(-3, 3) | _ANY,
    "repetition_penalty": st.floats(-1, 5) | st.sampled_from([1e-30, 1e30, 5e-324]) | _ANY,
    "logit_bias": st.dictionaries(
        st.builds(str, _TOKEN) | st.text(max_size=3), st.floats(-150, 150) | _ANY, max_size=4
    )
    | _ANY,
    "min_tokens": st.integers(-2, 10) | _ANY,
    "stop_token_ids": st.lists(_TOKEN, max_size=3) | _ANY,
}


def test_sampling_controls_fuzz_no_5xx(url, http):
    seen = set()

    @settings(
        max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(
        route=st.sampled_from([C, CH]),
        controls=st.fixed_dictionaries({}, optional=_CONTROLS),
        temperature=st.sampled_from([0, 0.7]),
    )
    def check(route, controls, temperature):
        base = comp() if route == C else chat()
        body = base | {"max_tokens": 4, "temperature": temperature} | controls
        r = http.post(url + route, json=body, timeout=60)
        seen.add(r.status_code)
        assert r.status_code in (200, 400), (body, r.status_code, r.text)
        if r.status_code == 400:
            param = r.json()["error"]["param"]
            assert param and param.split("[")[0].split(".")[0] in controls, (body, r.text)

    check()
    assert seen == {200, 400}  # both sides reached: served and refused


_SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {"enum": ["x", "y"]},
    {"type": "nonsense"},
    {"type": "string", "pattern": "(("},
    {"$ref": "#/$defs/missing"},
    {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
]
_FORMATS = (
    st.sampled_from([{"type": "text"}, {"type": "json_object"}, {"type": "json_schema"}])
    | st.builds(_fmt, st.sampled_from(_SCHEMAS))
    | st.builds(lambda t: {"type": t}, st.text(max_size=4))
    | _ANY
)
_TOOLS = st.lists(
    st.builds(
        _tool,
        st.sampled_from([None, _SCHEMAS[0], {"type": "object"}]),
        st.sampled_from(["f", "g", "a b", ""]),
    )
    | st.sampled_from([{"type": "function"}, {"type": "x", "function": {"name": "f"}}, 5]),
    max_size=3,
)
_CHOICES = (
    st.sampled_from(["auto", "none", "required", "sometimes"])
    | st.builds(lambda n: {"type": "function", "function": {"name": n}}, st.sampled_from("fgh"))
    | _ANY
)
_ITEMS = st.lists(
    st.sampled_from(
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "done"},
            {"type": "reasoning", "summary": []},
            {"role": "user", "content": [{"type": "input_image", "image_url": "u"}]},
        ]
    )
    | _ANY,
    max_size=4,
)
_RESP_TOOLS = st.lists(
    st.sampled_from(
        [
            {"type": "function", "name": "f"},
            {"type": "function", "name": "g", "parameters": _SCHEMAS[0], "strict": True},
            {"type": "web_search"},
        ]
    )
    | _ANY,
    max_size=3,
)
_API_FIELDS = {
    C: {
        "logprobs": st.integers(-2, 8) | _ANY,
        "echo": st.booleans() | _ANY,
        "response_format": _FORMATS,
        "stream": st.booleans(),
    },
    CH: {
        "logprobs": st.booleans() | _ANY,
        "top_logprobs": st.integers(-2, 25) | _ANY,
        "response_format": _FORMATS,
        "tools": _TOOLS | _ANY,
        "tool_choice": _CHOICES,
        "stream": st.booleans(),
    },
    R: {
        "input": _ITEMS | st.text(max_size=4),
        "instructions": st.text(max_size=4) | _ANY,
        "tools": _RESP_TOOLS | _ANY,
        "tool_choice": st.sampled_from(
            ["auto", "none", "required", {"type": "function", "name": "f"}]
        )
        | _ANY,
        "text": st.builds(lambda f: {"format": f}, _FORMATS) | _ANY,
        "include": st.lists(st.text(max_size=4), max_size=2) | _ANY,
        "store": st.booleans() | _ANY,
        "stream": st.booleans(),
    },
}


@pytest.mark.parametrize("route", [C, CH, R])
def test_api_fields_fuzz_no_5xx(url, http, route):
    """Issue 22's fields (logprobs, echo, structured output, tools) with values of every kind:
    each request is served (200, a stream without an error event) or refused (400 naming one of
    the fields sent), never a 5xx or a hang."""
    seen = set()

    @settings(
        max_examples=30, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(fields=st.fixed_dictionaries({}, optional=_API_FIELDS[route]))
    def check(fields):
        base, limit = {C: (comp(), "max_tokens"), CH: (chat(), "max_tokens")}.get(
            route, (resp(), "max_output_tokens")
        )
        body = base | {limit: 4, "temperature": 0} | fields
        r = http.post(url + route, json=body, timeout=60)
        seen.add(r.status_code)
        assert r.status_code in (200, 400), (body, r.status_code, r.text)
        if r.status_code == 400:
            param = r.json()["error"]["param"]
            assert param and param.split("[")[0].split(".")[0] in fields, (body, r.text)
        elif fields.get("stream") is True and route == R:  # Responses events, no [DONE]
            last = r.text.rstrip().rsplit("\n", 1)[-1]
            assert '"type":"response.completed"' in last or "response.incomplete" in last, r.text
        elif fields.get("stream") is True:
            assert r.text.rstrip().endswith("data: [DONE]") and '"error"' not in r.text, r.text

    check()
    assert seen == {200, 400}  # both sides reached: served and refused


def test_server_still_serves_after_the_battery(url, http):
    # ignore_eos: at temperature 1 the tiny model may sample EOS first and answer fewer tokens
    r = http.post(url + C, json=comp(max_tokens=3, ignore_eos=True), timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    r = http.post(
        url + C, json=comp(prompt=["x", "y", "z"], max_tokens=2, ignore_eos=True), timeout=30
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 6


def test_a_completion_without_max_tokens_gets_the_default_within_the_servers_cap():
    # OpenAI's completions default is 16 tokens; a server that allows fewer answers with its cap
    # rather than refusing a value the client never sent. An explicit value over it is refused.
    service, hosts, clients = inprocess_service(1, max_tokens_limit=8)
    try:
        with LiveServer(service, clients) as u:
            r = httpx.post(u + C, json=comp(ignore_eos=True), timeout=30)
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8
            r = httpx.post(u + C, json=comp(max_tokens=9), timeout=30)
            assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    finally:
        for h in hosts:
            h.shutdown()
    service, hosts, clients = inprocess_service(1, max_tokens_limit=64)
    try:
        with LiveServer(service, clients) as u:
            r = httpx.post(u + C, json=comp(ignore_eos=True), timeout=30)
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16
    finally:
        for h in hosts:
            h.shutdown()
