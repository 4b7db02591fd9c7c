"""Tools at the OpenAI edge: through the official ``openai`` client against a scripted backend
(the model's answer is a given text, so the parse is checked end to end, streamed and not,
whatever the tiny model would say), against a real router and worker (tools rendered into the
prompt, an agent loop whose every turn hits the cache), and bad tool inputs as 400s naming
the field."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from radixray.model_meta import load_model_meta

from ..router.serving import LiveServer, inprocess_service
from .scripted import ANSWER

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
    {"type": "function", "function": {"name": "now"}},
]
MESSAGES = [{"role": "user", "content": "Weather in Paris, and the time?"}]


def test_the_client_gets_tool_calls_whole(scripted):
    backend, client = scripted
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Checking."
    calls = choice.message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("now", {}),
    ]
    assert all(c.id.startswith("call_") and c.type == "function" for c in calls)
    # The tools went into the prompt in Hermes's format (the tiny model's ChatML has none).
    prompt = backend.meta.tokenizer.decode(backend.prompts[-1], skip_special_tokens=False)
    assert "<tools>\n" + json.dumps(TOOLS[0]) + "\n" in prompt


@pytest.mark.parametrize("pieces", [1, 7, 200])
def test_the_client_gets_tool_calls_streamed(scripted, pieces):
    backend, client = scripted
    backend.pieces = pieces
    try:
        stream = client.chat.completions.create(
            model="tiny", messages=MESSAGES, tools=TOOLS, stream=True
        )
        content, calls, reasons = "", {}, []
        for chunk in stream:
            for ch in chunk.choices:
                d = ch.delta
                content += d.content or ""
                for tc in d.tool_calls or []:
                    if tc.id:
                        assert tc.function.arguments == "" and tc.type == "function"
                        calls[tc.index] = [tc.function.name, ""]
                    else:
                        calls[tc.index][1] += tc.function.arguments
                reasons.append(ch.finish_reason)
    finally:
        backend.pieces = 13
    assert content == "Checking."
    assert [(n, json.loads(a)) for n, a in calls.values()] == [
        ("get_weather", {"city": "Paris"}),
        ("now", {}),
    ]
    assert [r for r in reasons if r] == ["tool_calls"]


def test_tool_choice_none_neither_renders_nor_parses(scripted):
    backend, client = scripted
    r = client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="none"
    )
    assert r.choices[0].message.content == ANSWER and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "stop"
    prompt = backend.meta.tokenizer.decode(backend.prompts[-1], skip_special_tokens=False)
    assert "<tools>" not in prompt


def test_required_and_named_are_enforced_by_a_grammar(scripted):
    """ "required" and a named function send a grammar (kind "grammar") with the request; "auto"
    sends none. (The scripted model ignores it: the real worker's tests below obey it.)"""
    backend, client = scripted
    for choice, grammar in (
        ("required", True),
        ({"type": "function", "function": {"name": "now"}}, True),
        ("auto", False),
    ):
        r = client.chat.completions.create(
            model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice=choice
        )
        assert len(r.choices[0].message.tool_calls) == 2
        spec = backend.grammars[-1]
        assert (spec is not None and spec.kind == "grammar") == grammar, spec
    named = backend.grammars[-2].spec  # the named function's: that function alone
    assert '"const": "now"' in named and '"const": "get_weather"' not in named


def test_parallel_tool_calls_false_keeps_one(scripted):
    _, client = scripted
    r = client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, parallel_tool_calls=False
    )
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_weather"]


def test_history_with_calls_and_results_is_rendered_in_hermes_format(scripted):
    backend, client = scripted
    history = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "21 C"},
    ]
    client.chat.completions.create(model="tiny", messages=history, tools=TOOLS)
    prompt = backend.meta.tokenizer.decode(backend.prompts[-1], skip_special_tokens=False)
    assert prompt.endswith(
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n21 C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


CALL = {"id": "c", "type": "function", "function": {"name": "now", "arguments": "{}"}}
BAD = [
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "retrieval", "function": {"name": "a"}}]}, "tools[0].type"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": "now"}, "tools"),
    ({"tools": [TOOLS[1], TOOLS[1]]}, "tools[1]"),
    (
        {
            "tools": [
                {"type": "function", "function": {"name": "a", "parameters": {"type": "array"}}}
            ]
        },
        "tools[0].function.parameters",
    ),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    (
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
        "tool_choice",
    ),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "now"}}}, "tool_choice"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    (
        {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
        "tool_choice",
    ),
    (
        {
            "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "now"}},
            "structured_outputs": {"regex": "a+"},
        },
        "tool_choice",
    ),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    (
        {"messages": [{"role": "user", "content": "x", "tool_call_id": "c"}]},
        "messages[0].tool_call_id",
    ),
    (
        {"messages": [{"role": "user", "content": "x", "tool_calls": [CALL]}]},
        "messages[0].tool_calls",
    ),
    ({"messages": [{"role": "assistant"}]}, "messages[0].content"),
    (
        {
            "messages": [
                {
                    "role": "assistant",
                    "tool_calls": [CALL | {"function": {"name": "now", "arguments": "[1]"}}],
                }
            ]
        },
        "messages[0].tool_calls[0].function.arguments",
    ),
    (
        {"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function"}]}]},
        "messages[0].tool_calls[0].function",
    ),
]


@pytest.mark.parametrize(("extra", "param"), BAD, ids=[p for _, p in BAD])
def test_bad_tool_input_is_a_400_naming_the_field(scripted, extra, param):
    backend, client = scripted
    body = {"model": "tiny", "messages": MESSAGES} | extra
    r = httpx.post(str(client.base_url) + "chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


# ---------------------------------------------------------------------- real router + worker


@pytest.fixture(scope="module")
def router_url():
    service, hosts, clients = inprocess_service(1, policy="ttft")
    with LiveServer(service, clients) as url:
        yield url
    for h in hosts:
        h.shutdown()


def test_an_agent_loop_hits_the_cache_on_every_turn(router_url):
    """Each turn appends the assistant's tool call and the tool's result to the history: the
    whole earlier prompt is cached, so cached_tokens grows with the history, turn after turn."""
    client = openai.OpenAI(base_url=f"{router_url}/v1", api_key="x", max_retries=0, timeout=60)
    messages = [{"role": "system", "content": "You call tools."}, *MESSAGES]
    cached, prompts = [], []
    for turn in range(4):
        r = client.chat.completions.create(
            model="tiny", messages=messages, tools=TOOLS, max_tokens=4, temperature=0
        )
        assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
        cached.append(r.usage.prompt_tokens_details.cached_tokens)
        prompts.append(r.usage.prompt_tokens)
        call = {
            "id": f"call_{turn}",
            "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": f"C{turn}"})},
        }
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{turn}", "content": f"{20 + turn} C"},
        ]
    # The previous turn's prompt is a prefix of this one's: all its whole pages (of 16) hit, and
    # of its answer what the next prompt shares (the tool call written here, not the model's:
    # not known in advance).
    for t in range(1, 4):
        assert cached[t] > cached[t - 1], cached
        assert prompts[t - 1] // 16 * 16 <= cached[t] < prompts[t], (cached, prompts)


def test_the_official_client_streams_a_tool_request_from_a_real_worker(router_url):
    client = openai.OpenAI(base_url=f"{router_url}/v1", api_key="x", max_retries=0, timeout=60)
    whole = client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, max_tokens=8, temperature=0
    )
    stream = client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, max_tokens=8, temperature=0, stream=True
    )
    text = "".join(ch.delta.content or "" for chunk in stream for ch in chunk.choices)
    # The tiny model's greedy answer is no tool call: content, the same both ways.
    assert (text or None) == whole.choices[0].message.content
    assert whole.usage.prompt_tokens > 300  # the tools block is in the prompt


def test_streamed_tool_calls_carry_every_token_id(scripted):
    """With ``return_token_ids``, every chunk's ids reach the client once, calls or not."""
    backend, client = scripted
    body = {"model": "tiny", "messages": MESSAGES, "tools": TOOLS, "stream": True}
    body["return_token_ids"] = True
    url = str(client.base_url) + "chat/completions"
    with httpx.stream("POST", url, json=body, timeout=30) as r:
        lines = [x[5:].strip() for x in r.iter_lines() if x.startswith("data:")]
    chunks = [json.loads(x) for x in lines[:-1]]
    ids = [t for c in chunks for ch in c["choices"] for t in ch.get("token_ids") or []]
    chunk_count = len(range(0, len(ANSWER), max(1, len(ANSWER) // backend.pieces)))
    assert len(ids) == chunk_count  # one id per scripted chunk
    names = [
        tc["function"]["name"]
        for c in chunks
        for ch in c["choices"]
        for tc in ch["delta"].get("tool_calls") or []
        if "id" in tc
    ]
    assert names == ["get_weather", "now"]


# Tools whose every call closes within a few dozen tokens, whatever random weights say.
FORCED_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "pattern": "^[a-z]{1,8}$"},
                    "unit": {"enum": ["c", "f"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "minimum": 0, "maximum": 99},
                    "b": {"$ref": "#/$defs/small"},
                },
                "required": ["a", "b"],
                "additionalProperties": False,
                "$defs": {"small": {"type": "integer", "minimum": 0, "maximum": 9}},
            },
        },
    },
    {"type": "function", "function": {"name": "now"}},  # no parameters: arguments are {}
]
NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}


def _forced_calls(client, stream: bool, **kw) -> tuple[str | None, list[tuple[str, str]], str]:
    """(content, [(name, arguments)], finish_reason) of one answer, streamed or whole."""
    kw = {"model": "tiny", "messages": MESSAGES, "tools": FORCED_TOOLS, "max_tokens": 400} | kw
    if not stream:
        choice = client.chat.completions.create(**kw).choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        return choice.message.content, calls, choice.finish_reason
    content, calls, reasons = "", {}, []
    for chunk in client.chat.completions.create(**kw, stream=True):
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for tc in ch.delta.tool_calls or []:
                if tc.id:
                    calls[tc.index] = [tc.function.name, tc.function.arguments or ""]
                else:
                    calls[tc.index][1] += tc.function.arguments
            reasons.append(ch.finish_reason)
    finish = [r for r in reasons if r]
    assert len(finish) == 1, finish
    return content or None, [tuple(c) for c in calls.values()], finish[0]


NAMED = {"type": "function", "function": {"name": "add"}}
FORCING = [
    ("required", None),
    ("required", False),
    (NAMED, None),
]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0, "seed": 3}])
@pytest.mark.parametrize(("choice", "parallel"), FORCING, ids=["required", "one", "named"])
def test_a_forced_tool_choice_always_gives_valid_calls(
    router_url, stream, sampling, choice, parallel
):
    """The tiny model's random weights call no tool of their own accord: the grammar alone
    makes its answer calls that parse, of the tools given (the named one when named), with
    arguments that validate against the tool's parameters."""
    import jsonschema

    client = openai.OpenAI(base_url=f"{router_url}/v1", api_key="x", max_retries=0, timeout=60)
    kw = {"tool_choice": choice} | sampling
    if parallel is not None:
        kw["parallel_tool_calls"] = parallel
    if choice == "required" and parallel is None:
        # One or more calls: random weights, greedy, would go on calling until max_tokens
        # (the grammar allows another call or the end after each). The stop token, favoured,
        # ends the answer as soon as the grammar allows it: after the first whole call.
        # (Several calls are parsed from sampled answers in test_tool_grammar.py.)
        (eos,) = load_model_meta("tiny").tokenizer.encode("<|im_end|>")
        kw["logit_bias"] = {str(eos): 100}
    content, calls, finish = _forced_calls(client, stream, **kw)
    assert finish == "tool_calls"
    assert content is None
    assert calls
    if choice != "required" or parallel is False:
        assert len(calls) == 1
    schemas = {t["function"]["name"]: t["function"].get("parameters") for t in FORCED_TOOLS}
    for name, arguments in calls:
        assert name == ("add" if choice == NAMED else name) and name in schemas
        jsonschema.validate(json.loads(arguments), schemas[name] or NO_ARGUMENTS)
