"""Discovery: /v1/models (OpenAI's fields and vLLM's ``max_model_len``), vLLM's /tokenize and
/detokenize, on the router (over real in-process workers) and on one worker's own server, and
in the OpenAPI description each serves. Then /tokenize with SmolLM2's real BPE tokenizer."""

from __future__ import annotations

import dataclasses

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from radixray.api import OpenAIApp, install_openai
from radixray.model_meta import load_model_meta

from ..router.serving import LiveServer, inprocess_service, worker_server

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Which tokens does this chat run on? \u00e9\u00e8"},
]


@pytest.fixture(scope="module", params=["router", "worker"])
def live(request):
    """``(url, the context length the server must report)``."""
    if request.param == "router":
        service, hosts, clients = inprocess_service(2)
        server = LiveServer(service, clients)
        max_len = service.meta.max_model_len
    else:
        server, host = worker_server("w0", max_model_len=1000)
        hosts = [host]
        max_len = 1000
    with server as url:
        yield url, max_len
    for h in hosts:
        h.shutdown()


@pytest.fixture(scope="module")
def http(live):
    """One keep-alive client for the module's requests (a client apiece cost more than most)."""
    with httpx.Client(timeout=30) as client:
        yield client


def test_models_lists_the_served_model_with_its_context_length(live, http):
    url, max_len = live
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    (m,) = client.models.list().data
    assert (m.id, m.object, m.owned_by) == ("tiny", "model", "radixray")
    assert isinstance(m.created, int) and m.created > 0
    assert m.model_extra["max_model_len"] == max_len
    assert client.models.retrieve("tiny").model_extra["max_model_len"] == max_len
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def test_tokenizer_info_lets_a_client_use_the_servers_tokenizer(live, http):
    # What lm-evaluation-harness's remote tokenizer reads: the end-of-text token (whose id it
    # takes from /tokenize), the chat template it renders chats with, the context length.
    url, max_len = live
    info = http.get(f"{url}/tokenizer_info").json()
    tok = load_model_meta("tiny").tokenizer
    assert info["eos_token"] == "<|im_end|>" and info["bos_token"] == "<|endoftext|>"
    assert info["chat_template"] == tok.chat_template and info["model_max_length"] == max_len
    assert info["tokenizer_class"] == "ByteTokenizer" and info["vocab_size"] == tok.vocab_size
    ids = http.post(f"{url}/tokenize", json={"prompt": info["eos_token"]}).json()["tokens"]
    assert ids == [tok.eos_token_id]


def test_tokenize_is_the_tokenizers_ids_and_detokenize_inverts_it(live, http):
    url, max_len = live
    tok = load_model_meta("tiny").tokenizer
    text = "plain text, \u00fcml\u00e4uts and <|im_start|> a special token"
    r = http.post(url + "/tokenize", json={"model": "tiny", "prompt": text}).json()
    assert r == {
        "count": len(tok.encode(text)),
        "max_model_len": max_len,
        "tokens": tok.encode(text),
    }
    back = http.post(url + "/detokenize", json={"model": "tiny", "tokens": r["tokens"]}).json()
    assert back == {"prompt": text}

    for gen in (True, False):
        rendered = tok.apply_chat_template(MESSAGES, add_generation_prompt=gen)
        body = {"messages": MESSAGES, "add_generation_prompt": gen}
        r = http.post(url + "/tokenize", json=body).json()
        assert r["tokens"] == tok.encode(rendered) and r["count"] == len(r["tokens"])
        back = http.post(url + "/detokenize", json={"tokens": r["tokens"]}).json()
        assert back["prompt"] == rendered
    default = http.post(url + "/tokenize", json={"messages": MESSAGES}).json()
    assert default["tokens"] == tok.encode(tok.apply_chat_template(MESSAGES, True))


def test_tokenize_gives_the_ids_a_completion_runs_on(live, http):
    url, _ = live
    prompt = "the same ids as the engine saw"
    ids = http.post(url + "/tokenize", json={"prompt": prompt}).json()["tokens"]
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 1, "return_token_ids": True}
    r = http.post(url + "/v1/completions", json=body, timeout=60).json()
    assert r["choices"][0]["prompt_token_ids"] == ids
    assert r["usage"]["prompt_tokens"] == len(ids)


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
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
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


def test_tokenize_renders_tools_as_the_chat_route_does(live, http):
    """/tokenize of messages with tools (and calls and results in the history) counts exactly
    the prompt_tokens of the same chat request (the official client on the chat side)."""
    url, _ = live
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
    tok = load_model_meta("tiny").tokenizer
    for messages in (MESSAGES, HISTORY):
        r = http.post(url + "/tokenize", json={"messages": messages, "tools": TOOLS}).json()
        plain = http.post(url + "/tokenize", json={"messages": messages}).json()
        assert r["count"] == len(r["tokens"]) > plain["count"]  # the tools are in the prompt
        text = http.post(url + "/detokenize", json={"tokens": r["tokens"]}).json()["prompt"]
        assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
        if messages is MESSAGES:  # (the history's call arguments go to the template parsed)
            rendered = tok.apply_chat_template(messages, True, tools=TOOLS)
            assert r["tokens"] == tok.encode(rendered)
        chat = client.chat.completions.create(
            model="tiny", messages=messages, tools=TOOLS, max_tokens=1
        )
        assert chat.usage.prompt_tokens == r["count"]
        # tool_choice "none" renders no tools, as /tokenize without them
        chat = client.chat.completions.create(
            model="tiny", messages=messages, tools=TOOLS, tool_choice="none", max_tokens=1
        )
        assert chat.usage.prompt_tokens == plain["count"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x", "tools": TOOLS}, "tools"),
        ({"messages": MESSAGES, "tools": []}, "tools"),
        ({"messages": MESSAGES, "tools": [TOOLS[1], TOOLS[1]]}, "tools[1]"),
        ({"messages": MESSAGES, "tools": [{"type": "function"}]}, "tools[0].function"),
        ({"messages": MESSAGES, "chat_template_kwargs": {}}, "chat_template_kwargs"),
    ],
)
def test_tokenize_refuses_bad_tools_naming_the_field(live, http, body, param):
    url, _ = live
    r = http.post(url + "/tokenize", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_openapi_describes_the_discovery_routes_from_their_schemas(live, http):
    url, _ = live
    doc = http.get(url + "/openapi.json").json()
    schemas = doc["components"]["schemas"]
    for path, model in (("/tokenize", "TokenizeRequest"), ("/detokenize", "DetokenizeRequest")):
        body = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert body["schema"]["$ref"] == f"#/components/schemas/{model}"
        assert model in schemas
    assert {"prompt", "messages", "add_generation_prompt", "tools"} <= set(
        schemas["TokenizeRequest"]["properties"]
    )
    assert "get" in doc["paths"]["/v1/models"]
    # A list of prompts is in the completion request's schema.
    prompt = schemas["CompletionRequest"]["properties"]["prompt"]
    assert len(prompt["anyOf"]) == 4


class _Backend:
    def __init__(self, meta):
        self.meta = meta
        self.max_tokens_limit = 64
        self.retry_after_s = 1


@pytest.mark.slow
def test_tokenize_with_smollm2_round_trips():
    meta = load_model_meta("smollm2")
    app = OpenAIApp()
    install_openai(app, _Backend(meta))
    client = TestClient(app)
    text = "Prefix caching: reuse the KV of a shared prompt prefix. \u00e9\u00e8 12345"
    ids = meta.tokenizer.encode(text)
    r = client.post("/tokenize", json={"model": meta.name, "prompt": text}).json()
    assert r["tokens"] == ids and r["max_model_len"] == meta.max_model_len
    assert client.post("/detokenize", json={"tokens": ids}).json()["prompt"] == text
    rendered = meta.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    r = client.post("/tokenize", json={"messages": MESSAGES}).json()
    assert r["tokens"] == meta.tokenizer.encode(rendered)
    assert client.post("/detokenize", json={"tokens": r["tokens"]}).json()["prompt"] == rendered


def test_a_served_name_with_a_slash_is_retrieved():
    meta = dataclasses.replace(load_model_meta("tiny"), name="org/tiny")
    app = OpenAIApp()
    install_openai(app, _Backend(meta))
    client = TestClient(app)
    assert client.get("/v1/models/org/tiny").json()["id"] == "org/tiny"
    r = client.get("/v1/models/tiny")
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
