"""The router's HTTP API against real in-process workers (tiny model), through the official
``openai`` client and plain HTTP."""

from __future__ import annotations

import os

import httpx
import openai
import pytest

from radixray.model_meta import load_model_meta
from radixray.router.service import RouterService, RouterSettings
from radixray.worker import WorkerHost

from .serving import LiveServer, local_client

TOKEN = "test-admin-token"


@pytest.fixture(scope="module")
def live():
    meta = load_model_meta("tiny")
    service = RouterService(
        meta, RouterSettings(policy="ttft", page_size=4, admin_token=TOKEN, poll_interval_s=0.1)
    )
    hosts = [WorkerHost({"model": "tiny", "page_size": 4}, f"w{i}") for i in range(2)]
    server = LiveServer(service, lambda: [local_client(h) for h in hosts])
    with server as url:
        yield server, url, service, hosts
    for h in hosts:
        h.shutdown()


@pytest.fixture(scope="module")
def client(live):
    _, url, _, _ = live
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_completions_non_stream_and_stream(client):
    r = client.completions.create(model="tiny", prompt="hello there", max_tokens=7, temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 7 and r.usage.prompt_tokens == len(b"hello there")
    assert r.usage.total_tokens == r.usage.prompt_tokens + 7
    chunks = list(
        client.completions.create(
            model="tiny",
            prompt="hello there",
            max_tokens=7,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == r.choices[0].text
    assert chunks[-1].usage.completion_tokens == 7
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_chat_non_stream_and_stream(client):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=5, temperature=0)
    assert r.choices[0].message.role == "assistant" and r.usage.completion_tokens == 5
    s = list(
        client.chat.completions.create(
            model="tiny", messages=msgs, max_tokens=5, temperature=0, stream=True
        )
    )
    assert s[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in s) == r.choices[0].message.content


def test_stop_string_and_seed(client):
    base = (
        client.completions.create(model="tiny", prompt="stop test", max_tokens=12, temperature=0)
        .choices[0]
        .text
    )
    visible = base.replace("\ufffd", "")
    if len(visible) >= 2:
        stop = visible[1]
        cut = client.completions.create(
            model="tiny", prompt="stop test", max_tokens=12, temperature=0, stop=[stop]
        ).choices[0]
        assert cut.finish_reason == "stop" and stop not in cut.text
    a = (
        client.completions.create(
            model="tiny", prompt="seeded", max_tokens=8, seed=3, temperature=1.0
        )
        .choices[0]
        .text
    )
    b = (
        client.completions.create(
            model="tiny", prompt="seeded", max_tokens=8, seed=3, temperature=1.0
        )
        .choices[0]
        .text
    )
    assert a == b


def test_repeated_long_prefix_hits_the_same_worker(live, client):
    _, url, service, _ = live
    system = "You are a routing test. " * 12
    tok = service.meta.tokenizer
    workers, cached, prompts = [], [], []
    for q in ("first question", "second question", "third question"):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": q}]
        prompts.append(tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True)))
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=messages, max_tokens=3
        )
        workers.append(raw.headers["x-radixray-worker"])
        cached.append(int(raw.headers["x-radixray-cached-tokens"]))
        assert raw.parse().usage.prompt_tokens_details.cached_tokens == cached[-1]
    decisions = httpx.get(f"{url}/debug/decisions?limit=3").json()["decisions"]
    assert len(set(workers)) == 1, decisions
    # The first sees at most the chat template's shared head; the others reuse every whole page
    # (of 4) of what the prompts share: the system prompt and the user turn's head, exactly.
    shared = len(os.path.commonprefix(prompts))
    assert cached[0] < len(system) < shared
    assert cached[1:] == [shared // 4 * 4] * 2, (cached, shared)


def test_models_health_metrics_debug(live, client):
    _, url, service, _ = live
    client.completions.create(model="tiny", prompt="metrics please", max_tokens=2)
    assert [m.id for m in client.models.list().data] == ["tiny"]
    h = httpx.get(f"{url}/health").json()
    assert h == {
        "status": "ok",
        "model": "tiny",
        "router_id": service.router_id,
        "routers": 1,
        "workers": 2,
        "healthy_workers": 2,
    }
    m = httpx.get(f"{url}/metrics").text
    for name in (
        "radixray_requests_total",
        "radixray_ttft_seconds_bucket",
        'radixray_prompt_tokens_total{cause="cold"}',
        "radixray_cluster_hit_rate",
        'radixray_worker_pages{kind="free",worker="w0"}',
        "radixray_decisions_total",
        "radixray_index_entries",
        'radixray_index_lost_blocks_total{kind="returned"}',
        'radixray_worker_load{field="routed_prefill_tokens_per_s",worker="w0"}',
    ):
        assert name in m, name
    d = httpx.get(f"{url}/debug/decisions?limit=5").json()
    last = d["decisions"][-1]
    assert last["worker_id"] in ("w0", "w1") and last["actual_cached_tokens"] is not None
    assert sum(last["miss"].values()) == last["prompt_tokens"]
    cache = httpx.get(f"{url}/debug/cache").json()
    assert set(cache["workers"]) == {"w0", "w1"}
    total_index = sum(w["index_blocks"] for w in cache["workers"].values())
    assert total_index == service.index.num_blocks() > 0


def test_admin_requires_token(live):
    _, url, _, _ = live
    assert httpx.get(f"{url}/admin/workers").status_code == 401
    bad = httpx.get(f"{url}/admin/workers", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401 and bad.json()["error"]["code"] == "invalid_token"
    ok = httpx.get(f"{url}/admin/workers", headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200 and len(ok.json()["workers"]) == 2
    assert httpx.delete(f"{url}/admin/workers/w0").status_code == 401


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "tiny", "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
        ({"model": "tiny", "prompt": "x", "max_tokens": "ten"}, 400, "max_tokens"),
        ({"model": "tiny", "prompt": "x", "temperature": 5}, 400, "temperature"),
        ({"model": "tiny", "prompt": ""}, 400, "prompt"),
        ({"model": "tiny"}, 400, "prompt"),
        ({"model": "nope", "prompt": "x"}, 404, "model"),
        ({"model": "tiny", "prompt": "x", "bogus": 1}, 400, "bogus"),
        ({"model": "tiny", "prompt": [1, 99999]}, 400, "prompt"),
        ({"model": "tiny", "prompt": "x", "max_tokens": 10**6}, 400, "max_tokens"),
        ({"model": "tiny", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ],
)
def test_bad_completion_input(live, body, status, param):
    _, url, _, _ = live
    r = httpx.post(f"{url}/v1/completions", json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "tiny", "messages": []}, "messages"),
        ({"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"model": "tiny", "messages": [{"role": "user"}]}, "messages[0].content"),
        ({"model": "tiny", "messages": "hi"}, "messages"),
    ],
)
def test_bad_chat_input(live, body, param):
    _, url, _, _ = live
    r = httpx.post(f"{url}/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_malformed_json_and_oversized_body(live):
    _, url, service, _ = live
    r = httpx.post(
        f"{url}/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(
        f"{url}/v1/completions",
        content=b'{"model": "tiny", "prompt": "\xff\xfe"}',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400
    big = b"x" * (service.settings.max_body_bytes + 1)
    r = httpx.post(
        f"{url}/v1/completions", content=big, headers={"content-type": "application/json"}
    )
    assert r.status_code == 413


def test_workers_leak_nothing_after_traffic(live, client):
    server, _, _, hosts = live
    for i in range(6):
        client.completions.create(model="tiny", prompt=f"leak check {i} " * 5, max_tokens=4)
    for h in hosts:
        server.call(h.check_integrity())
        s = h.engine.stats()
        assert h.engine.cache.protected_tokens == 0
        assert s["free_pages"] + s["cached_pages"] == s["total_pages"]


def test_the_router_has_no_internal_or_abort_route(live):
    # Aborting is the worker protocol's, behind the cluster token; the router's public API
    # offers no way to reach another client's request.
    _, url, _, _ = live
    with httpx.Client(base_url=url, timeout=10) as c:
        for path in ("/internal/abort", "/internal/generate", "/v1/abort", "/abort"):
            r = c.post(path, content=b"")
            assert r.status_code in (404, 405), (path, r.status_code)
        paths = set(c.get("/openapi.json").json()["paths"])
        assert not any("abort" in p or p.startswith("/internal") for p in paths), paths
