"""The Responses API (``POST /v1/responses``) through the official ``openai`` client: against a
scripted backend (the model's answer is a given text, so output items and the streamed events
are checked exactly, whatever the tiny model would say), against a real router over two
in-process workers on the tiny model (stored responses continued with their prefix cached, a
forced tool call, structured output, the token limit), and bad input as 400s naming the field."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from radixray.api import ResponseStore, ResponseStoreConfig

from ..router.serving import LiveServer, inprocess_service, local_client, served

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
    {"type": "function", "name": "now", "parameters": None},
]
CITY_TOOL = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


@pytest.fixture(scope="module", params=["router", "worker"])
def router(request):
    """``(url, client, page size)``: a router over two in-process workers, or a worker served
    on its own."""
    with served(request.param) as (url, hosts):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)
        yield url, client, hosts[0].engine.config.page_size


def _items(r) -> list[tuple]:
    """A response's output items without their random ids."""
    out = []
    for item in r.output:
        if item.type == "message":
            out.append(("message", item.status, [p.text for p in item.content]))
        else:
            out.append(("function_call", item.status, item.name, json.loads(item.arguments)))
    return out


EXPECTED = [
    ("message", "completed", ["Checking."]),
    ("function_call", "completed", "get_weather", {"city": "Paris"}),
    ("function_call", "completed", "now", {}),
]


def test_tool_calls_come_back_as_output_items(scripted):
    backend, client = scripted
    r = client.responses.create(
        model="tiny", input="Weather in Paris, and the time?", tools=TOOLS, instructions="Be brief"
    )
    assert r.status == "completed" and r.object == "response"
    assert _items(r) == EXPECTED
    calls = [o for o in r.output if o.type == "function_call"]
    assert all(c.call_id.startswith("call_") and c.id.startswith("fc_") for c in calls)
    assert len({c.call_id for c in calls}) == 2
    assert r.output_text == "Checking."
    assert r.usage.input_tokens == len(backend.prompts[-1])
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert [t.name for t in r.tools] == ["get_weather", "now"] and r.instructions == "Be brief"
    # The instructions are the system message, the tools rendered as chat renders them.
    prompt = backend.meta.tokenizer.decode(backend.prompts[-1], skip_special_tokens=False)
    assert prompt.startswith("<|im_start|>system\nBe brief") and "<tools>" in prompt


@pytest.mark.parametrize("pieces", [1, 7, 200])
def test_the_stream_helper_accepts_the_events(scripted, pieces):
    backend, client = scripted
    backend.pieces = pieces
    try:
        with client.responses.stream(model="tiny", input="Weather?", tools=TOOLS) as stream:
            events = list(stream)
            final = stream.get_final_response()
    finally:
        backend.pieces = 13
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 1
    message = (
        ["response.output_item.added", "response.content_part.added"]
        + ["response.output_text.delta"] * deltas
        + ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    )
    call = [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    assert kinds == (
        ["response.created", "response.in_progress"]
        + message
        + call
        + call
        + ["response.completed"]
    )
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == (
        "Checking."
    )
    assert _items(final) == EXPECTED
    assert [e.output_index for e in events if e.type == "response.output_item.added"] == [0, 1, 2]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [(e.name, json.loads(e.arguments)) for e in done] == [
        ("get_weather", {"city": "Paris"}),
        ("now", {}),
    ]


def test_history_items_become_the_chat_they_mean(scripted):
    backend, client = scripted
    history = [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_a",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
            "status": "completed",
        },
        {"type": "function_call_output", "call_id": "call_a", "output": "sunny, 21 C"},
        {"type": "reasoning", "id": "rs_1", "summary": []},  # another model's: skipped
    ]
    r = client.responses.create(model="tiny", input=history, tools=TOOLS)
    prompt = backend.meta.tokenizer.decode(backend.prompts[-1], skip_special_tokens=False)
    # One assistant turn holding its text and its call, the result as the tool's message.
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert "<|im_start|>assistant\nChecking.\n" + call in prompt
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt
    # The stored response lists its input items, paged as the client pages them.
    listed = list(client.responses.input_items.list(r.id, order="asc", limit=2))
    assert [i.type for i in listed] == [
        "message",
        "message",
        "function_call",
        "function_call_output",
    ]
    assert listed[0].content[0].type == "input_text" and listed[1].content[0].text == "Checking."
    assert listed[2].call_id == listed[3].call_id == "call_a"
    assert len({i.id for i in listed}) == 4
    newest = client.responses.input_items.list(r.id, limit=1)
    assert [i.id for i in newest.data] == [listed[-1].id] and newest.has_more
    bad = client._client.get(f"{client.base_url}responses/{r.id}/input_items", params={"limit": 0})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "limit"


def test_fields_that_change_nothing_are_accepted_and_echoed(scripted):
    _, client = scripted
    r = client.responses.create(
        model="tiny",
        input="hi",
        include=["reasoning.encrypted_content"],
        metadata={"team": "a"},
        truncation="auto",
        store=False,
        prompt_cache_key="tenant-7",
        safety_identifier="u-1",
        service_tier="auto",
        reasoning={"effort": "low"},
        extra_body={"prompt_cache_retention": "in_memory"},
    )
    assert r.status == "completed" and r.metadata == {"team": "a"}
    assert r.truncation == "auto" and r.store is False and r.prompt_cache_key == "tenant-7"
    with pytest.raises(openai.NotFoundError):  # store false: nothing kept
        client.responses.retrieve(r.id)


@pytest.mark.parametrize(
    "body, param",
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "name": "a b"}]}, "tools[0].name"),
        ({"background": True}, "background"),
        ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice.type"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            "input[0].content[0].type",
        ),
        (
            {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]},
            "input[0].arguments",
        ),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
        ({"input": [{"type": "computer_call_output"}]}, "input[0].type"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"max_output_tokens": 10**6}, "max_output_tokens"),
        ({"temperature": 3}, "temperature"),
        (
            {"text": {"format": {"type": "json_schema", "schema": {}}}},
            "text.format.json_schema.name",
        ),
        ({"conversation": "conv_1"}, "conversation"),
        ({"previous_response_id": "resp_nope"}, "previous_response_id"),
        ({"model": "gpt-5"}, "model"),
    ],
)
def test_bad_input_is_a_4xx_naming_the_field(scripted, body, param):
    _, client = scripted
    sent = {"model": "tiny", "input": "hi"} | body
    r = client._client.post(str(client.base_url) + "responses", json=sent)
    assert r.status_code in (400, 404), r.text
    err = r.json()["error"]
    assert err["param"] == param or param.startswith(err["param"] or "\0"), (err, param)
    if r.status_code == 404:
        assert err["code"] in ("response_not_found", "model_not_found")


# ---------------------------------------------------------------------- a real router


def test_a_continued_response_finds_its_first_turn_cached(router):
    url, client, page = router
    first = client.responses.create(
        model="tiny",
        input="Tell me about the sea, in some detail please.",
        instructions="You are terse.",
        max_output_tokens=12,
        temperature=0,
        prompt_cache_key="conversation-1",
    )
    assert first.status == "incomplete" and first.incomplete_details.reason == "max_output_tokens"
    assert first.usage.output_tokens == 12
    second = client.responses.create(
        model="tiny",
        input="And about rivers?",
        instructions="You are terse.",
        previous_response_id=first.id,
        max_output_tokens=4,
        temperature=0,
        prompt_cache_key="conversation-1",
    )
    assert second.previous_response_id == first.id
    # The first turn's prompt is a prefix of the second's: its full pages come from the cache.
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens >= (
        first.usage.input_tokens // page * page
    )
    # The continuation's prompt is the first's input and output, then the new input: a client
    # that sends the same conversation whole gets the same prompt.
    whole = client.responses.create(
        model="tiny",
        input=[
            {"role": "user", "content": "Tell me about the sea, in some detail please."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "And about rivers?"},
        ],
        instructions="You are terse.",
        max_output_tokens=4,
        temperature=0,
        store=False,
    )
    assert whole.usage.input_tokens == second.usage.input_tokens
    assert whole.output_text == second.output_text
    # Stored: read back, deleted, then gone (404 naming it).
    assert client.responses.retrieve(first.id).output_text == first.output_text
    client.responses.delete(first.id)
    r = httpx.get(f"{url}/v1/responses/{first.id}")
    assert r.status_code == 404 and first.id in r.json()["error"]["message"]
    r = httpx.post(
        f"{url}/v1/responses",
        json={"model": "tiny", "input": "x", "previous_response_id": first.id},
    )
    assert r.status_code == 404 and r.json()["error"]["param"] == "previous_response_id"


def test_a_real_worker_streams_a_forced_call_and_structured_text(router):
    _, client, _ = router
    with client.responses.stream(
        model="tiny",
        input="Weather in Oslo?",
        tools=[CITY_TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=200,
        temperature=0.9,
    ) as stream:
        final = stream.get_final_response()
    assert final.status == "completed"
    (call,) = final.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments)["city"] in ("Paris", "Oslo")
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
        "required": ["n", "ok"],
    }
    r = client.responses.create(
        model="tiny",
        input="A number",
        text={"format": {"type": "json_schema", "name": "answer", "schema": schema}},
        max_output_tokens=200,
        temperature=1.0,
        extra_body={"seed": 3},
    )
    assert r.status == "completed"
    value = json.loads(r.output_text)
    jsonschema.validate(value, schema)
    assert set(value) == {"n", "ok"}  # no property the schema did not name


def test_a_router_names_the_store_an_id_belongs_to():
    """Two routers over the same workers: a response stored by one is a 404 on the other
    that names the store holding it (each router keeps its own responses)."""
    service_a, hosts, clients = inprocess_service(2, policy="ttft", router_id="router-a")
    from radixray.model_meta import load_model_meta
    from radixray.router.service import RouterService, RouterSettings

    service_b = RouterService(
        load_model_meta("tiny"), RouterSettings(page_size=4, poll_interval_s=0.1, router_id="b")
    )
    try:
        with (
            LiveServer(service_a, clients) as url_a,
            LiveServer(service_b, lambda: [local_client(h) for h in hosts]) as url_b,
        ):
            body = {"model": "tiny", "input": "hello", "max_output_tokens": 2}
            rid = httpx.post(f"{url_a}/v1/responses", json=body, timeout=60).json()["id"]
            assert httpx.get(f"{url_a}/v1/responses/{rid}").status_code == 200
            r = httpx.get(f"{url_b}/v1/responses/{rid}")
            assert r.status_code == 404
            msg = r.json()["error"]["message"]
            tag = ResponseStore("router-a").tag
            assert rid.startswith(f"resp_{tag}_"), (rid, tag)
            assert f"store tag {tag}" in msg, msg
            assert "another router" in msg
    finally:
        for h in hosts:
            h.shutdown()


# ---------------------------------------------------------------------- the store


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _response(store: ResponseStore) -> dict:
    return {"id": store.new_id(), "output": []}


def test_the_store_keeps_the_most_recently_used_within_its_bounds():
    clock = _Clock()
    store = ResponseStore("r", ResponseStoreConfig(3, 10.0), clock)
    a, b, c, d = (_response(store) for _ in range(4))
    for r in (a, b, c):
        assert store.put(r, [{"type": "message", "role": "user", "content": "x"}])
    clock.t = 5.0
    assert store.get(a["id"]).response is a  # a is used: b is now the oldest
    store.put(d, [])
    assert len(store) == 3
    with pytest.raises(Exception, match="never stored here"):
        store.get(b["id"])
    clock.t = 12.0  # c was stored at 0, a read and d stored at 5: c ages out
    with pytest.raises(Exception, match="expired"):
        store.get(c["id"])
    assert store.get(d["id"]).response is d
    assert len(store) == 2
    clock.t = 30.0
    assert len(store) == 0
    assert not ResponseStore("r", ResponseStoreConfig(0, 1.0)).put(_response(store), [])
    with pytest.raises(ValueError, match="responses_store_age_s"):
        ResponseStoreConfig(1, 0)


class _FailingBackend:
    """A worker that fails after the answer's first chunk."""

    max_tokens_limit = 4096
    retry_after_s = 1

    def __init__(self):
        from radixray.model_meta import load_model_meta

        self.meta = load_model_meta("tiny")
        self.closed = 0

    async def open(self, req, session_key, cache_key=None):
        from radixray.protocol import EngineFailure, StreamChunk

        backend = self

        class Stream:
            worker_id = "failing"
            first = StreamChunk([1], "Hel")
            cached_tokens = 0

            async def __aiter__(self):
                yield self.first
                raise EngineFailure("the engine failed mid-answer")

            async def aclose(self):
                backend.closed += 1

        return Stream()


def test_a_worker_failing_mid_stream_ends_the_response_failed_and_stores_nothing():
    from radixray.api import OpenAIApp, install_openai

    from ..router.serving import LiveApp

    backend = _FailingBackend()
    app = OpenAIApp()
    install_openai(app, backend)
    with LiveApp(app) as url:
        body = {"model": "tiny", "input": "hi", "stream": True}
        with httpx.stream("POST", f"{url}/v1/responses", json=body, timeout=30) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        assert r.status_code == 200
        kinds = [e["type"] for e in events]
        assert kinds[:4] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
        ]
        assert kinds[-4:] == [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.failed",
        ]
        failed = events[-1]["response"]
        assert failed["status"] == "failed" and "mid-answer" in failed["error"]["message"]
        assert failed["output"][0]["status"] == "incomplete"
        assert failed["output"][0]["content"][0]["text"] == "Hel"
        assert backend.closed == 1
        r = httpx.get(f"{url}/v1/responses/{failed['id']}")
        assert r.status_code == 404  # a failed response is not stored
