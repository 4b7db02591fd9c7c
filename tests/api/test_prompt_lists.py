"""A list of prompts on /v1/completions, through the official ``openai`` client, against the
router over real in-process workers and against one worker's own server: every prompt is its
own request, the answer's choice ``i`` is prompt ``i``'s (n = 1), equal (greedy) to the same
prompt sent alone, usage sums them, streamed and not. Then the serve path's all-or-nothing
opening, on a fake backend."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from radixray.api import OpenAIApp, install_openai
from radixray.api.answers import TextAnswer
from radixray.api.streams import sse_events
from radixray.model_meta import load_model_meta
from radixray.protocol import Overloaded, StreamChunk, WorkerUnavailable

from ..router.serving import served

PROMPTS = ["The cache", "a longer prompt that shares nothing with the others", "x", "The cache!"]
GREEDY = {"model": "tiny", "max_tokens": 6, "temperature": 0}


@pytest.fixture(scope="module", params=["router", "worker"])
def live(request):
    with served(request.param) as (url, hosts):
        yield url, request.param
        for h in hosts:
            h.engine.check_integrity()


@pytest.fixture(scope="module")
def client(live):
    url, _ = live
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def alone(client):
    """Each prompt's answer when sent on its own."""
    return [client.completions.create(prompt=p, **GREEDY) for p in PROMPTS]


def test_a_list_of_prompts_answers_each_as_if_sent_alone(client, alone):
    r = client.completions.create(prompt=PROMPTS, **GREEDY)
    assert [c.index for c in r.choices] == list(range(len(PROMPTS)))
    assert [c.text for c in r.choices] == [a.choices[0].text for a in alone]
    assert [c.finish_reason for c in r.choices] == [a.choices[0].finish_reason for a in alone]
    assert r.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert r.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens == sum(len(p.encode()) for p in PROMPTS)  # a byte is a token


def test_token_id_prompts_equal_their_text(client, alone):
    tok = load_model_meta("tiny").tokenizer
    ids = [tok.encode(p) for p in PROMPTS]
    r = client.completions.create(prompt=ids, **GREEDY)
    assert [c.text for c in r.choices] == [a.choices[0].text for a in alone]
    one = client.completions.create(prompt=ids[1], **GREEDY)  # one prompt as a token-id list
    assert len(one.choices) == 1 and one.choices[0].text == alone[1].choices[0].text
    single = client.completions.create(prompt=PROMPTS[2:3], **GREEDY)  # a list of one
    assert [c.text for c in single.choices] == [alone[2].choices[0].text]


def test_streamed_choices_interleave_under_their_index(client, alone):
    stream = client.completions.create(
        prompt=PROMPTS, stream=True, stream_options={"include_usage": True}, **GREEDY
    )
    texts = ["" for _ in PROMPTS]
    finishes: list[list[str]] = [[] for _ in PROMPTS]
    usages = []
    for chunk in stream:
        if chunk.usage is not None:
            usages.append(chunk.usage)
        for c in chunk.choices:
            texts[c.index] += c.text
            if c.finish_reason is not None:
                finishes[c.index].append(c.finish_reason)
    assert texts == [a.choices[0].text for a in alone]
    assert finishes == [[a.choices[0].finish_reason] for a in alone]
    (use,) = usages
    assert use.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    assert use.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)


def test_one_done_and_token_ids_per_choice(live, alone):
    url, kind = live
    tok = load_model_meta("tiny").tokenizer
    body = GREEDY | {"prompt": PROMPTS, "return_token_ids": True}
    r = httpx.post(url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    for c, p, a in zip(r.json()["choices"], PROMPTS, alone, strict=True):
        assert c["prompt_token_ids"] == tok.encode(p)
        assert tok.decode(c["token_ids"]) == c["text"] == a.choices[0].text
    workers = r.headers["x-radixray-worker"].split(",")
    assert len(workers) == len(PROMPTS)  # each prompt placed as its own request

    with httpx.stream("POST", url + "/v1/completions", json=body | {"stream": True}) as s:
        lines = [x[5:].strip() for x in s.iter_lines() if x.startswith("data:")]
    assert lines.count("[DONE]") == 1 and lines[-1] == "[DONE]"
    prompt_ids: dict[int, list[list[int]]] = {}
    token_ids: dict[int, list[int]] = {}
    for chunk in map(json.loads, lines[:-1]):
        for c in chunk["choices"]:
            if "prompt_token_ids" in c:
                prompt_ids.setdefault(c["index"], []).append(c["prompt_token_ids"])
            token_ids.setdefault(c["index"], []).extend(c["token_ids"])
    assert prompt_ids == {i: [tok.encode(p)] for i, p in enumerate(PROMPTS)}
    assert [tok.decode(token_ids[i]) for i in range(len(PROMPTS))] == [
        a.choices[0].text for a in alone
    ]


def test_a_bad_element_is_refused_before_any_prompt_runs(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(prompt=["fine", ""], **GREEDY)
    assert e.value.body["param"] == "prompt[1]"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(prompt=[[1, 2], [3, 10**6]], **GREEDY)
    assert e.value.body["param"] == "prompt[1]"
    for field, value in (("suffix", "tail"), ("best_of", 2)):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(prompt=PROMPTS, **GREEDY, **{field: value})
        assert e.value.body["param"] == field


# ------------------------------------------------------------- opening all or nothing


class _Stream:
    def __init__(self, worker_id: str, text: str):
        self.worker_id = worker_id
        self.first = StreamChunk([1], text, finish_reason="length", completion_tokens=1)
        self.cached_tokens = 0
        self.closed = False

    async def __aiter__(self):
        yield self.first

    async def aclose(self) -> None:
        self.closed = True


class _Backend:
    """Opens every prompt but the one ``refuse`` names, which is overloaded."""

    def __init__(self, refuse: int | None):
        self.meta = load_model_meta("tiny")
        self.max_tokens_limit = 64
        self.retry_after_s = 1
        self.refuse = refuse
        self.opened: list[_Stream] = []

    async def open(self, req, session_key, cache_key=None):
        await asyncio.sleep(0)
        if self.refuse is not None and req.prompt_ids == list(PROMPTS[self.refuse].encode()):
            raise Overloaded("busy")
        s = _Stream(req.request_id, bytes(req.prompt_ids).decode())
        self.opened.append(s)
        return s


def _app(backend) -> TestClient:
    app = OpenAIApp()
    install_openai(app, backend)
    return TestClient(app)


def test_one_prompt_refused_closes_the_opened_ones_and_answers_the_refusal():
    backend = _Backend(refuse=2)
    r = _app(backend).post("/v1/completions", json=GREEDY | {"prompt": PROMPTS})
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert len(backend.opened) == len(PROMPTS) - 1
    assert all(s.closed for s in backend.opened)


def test_request_ids_are_distinct_and_choices_in_prompt_order():
    backend = _Backend(refuse=None)
    r = _app(backend).post("/v1/completions", json=GREEDY | {"prompt": PROMPTS})
    assert r.status_code == 200, r.text
    ids = [s.worker_id for s in backend.opened]  # the fake names its stream by request id
    assert len(set(ids)) == len(PROMPTS)
    assert [c["text"] for c in r.json()["choices"]] == PROMPTS
    assert r.json()["usage"]["completion_tokens"] == len(PROMPTS)


# ------------------------------------------------------------- merging streams


class _Slow:
    """A stream of ``n`` one-token chunks, the last one final; or failing after ``fail_after``."""

    def __init__(self, text: str, n: int, fail_after: int | None = None):
        self.worker_id, self.cached_tokens = "w", 0
        self.chunks = [
            StreamChunk([1], text, finish_reason="length" if i == n - 1 else None) for i in range(n)
        ]
        self.first = self.chunks[0]
        self.fail_after = fail_after
        self.closed = False

    async def __aiter__(self):
        for i, c in enumerate(self.chunks):
            if i == self.fail_after:
                raise WorkerUnavailable("worker w failed mid-stream")
            await asyncio.sleep(0)
            yield c

    async def aclose(self) -> None:
        self.closed = True


def _events(raw: list[bytes]) -> list:
    return [json.loads(e.removeprefix(b"data: ")) if b"[DONE]" not in e else "DONE" for e in raw]


async def test_merged_stream_indexes_every_chunk_and_ends_once():
    streams = [_Slow("a", 3), _Slow("b", 1), _Slow("c", 5)]
    raw = [e async for e in sse_events(streams, TextAnswer("tiny"), include_usage=True)]
    events = _events(raw)
    assert events[-1] == "DONE" and events.count("DONE") == 1
    texts: dict[int, str] = {}
    for e in events[:-2]:
        (c,) = e["choices"]
        texts[c["index"]] = texts.get(c["index"], "") + c["text"]
    assert texts == {0: "aaa", 1: "b", 2: "ccccc"}
    assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == 0
    assert all(s.closed for s in streams)


async def test_a_worker_failing_mid_stream_ends_the_answer_with_one_error():
    streams = [_Slow("a", 50), _Slow("b", 50, fail_after=2)]
    events = _events([e async for e in sse_events(streams, TextAnswer("tiny"), False)])
    assert events[-1] == "DONE" and events.count("DONE") == 1
    errors = [e for e in events[:-1] if "error" in e]
    assert len(errors) == 1 and errors[0]["error"]["code"] == "worker_failed"
    assert all(s.closed for s in streams)  # the other prompt is aborted too


async def test_a_client_leaving_closes_every_stream():
    streams = [_Slow("a", 50), _Slow("b", 50)]
    events = sse_events(streams, TextAnswer("tiny"), False)
    for _ in range(3):
        await events.__anext__()
    await events.aclose()
    assert all(s.closed for s in streams)
    pumps = [t for t in asyncio.all_tasks() if "pump" in repr(t.get_coro())]
    assert pumps == []
