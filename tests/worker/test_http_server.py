"""The worker's HTTP server (``radixray worker``) and the protocol's HTTP transport, against real
worker apps: every method, the cluster token, bad bodies, and the router fronting workers over
HTTP (what ``radixray serve --worker-urls`` runs)."""

from __future__ import annotations

import asyncio

import httpx
import msgspec
import pytest

from radixray.cache_index import hash_blocks
from radixray.cache_index.events import BlockStored, decode_events
from radixray.model_meta import load_model_meta
from radixray.protocol import (
    PROTOCOL_VERSION,
    ErrorInfo,
    ErrorKind,
    GenerateRequest,
    InvalidRequest,
    SamplingParams,
    WorkerClient,
    WorkerUnavailable,
    encode,
)
from radixray.protocol import decode as decode_msg
from radixray.protocol.http_transport import MSGPACK, HttpTransport
from radixray.router.service import RouterService, RouterSettings
from tests.router.serving import LiveServer, wait_for

from .conftest import TOKEN

GREEDY3 = SamplingParams(max_tokens=3, temperature=0.0)


async def _generate(client: WorkerClient, ids, rid, params=GREEDY3):
    return [c async for c in client.generate(GenerateRequest(rid, ids, params))]


def test_info_generate_poll_abort(worker_app):
    url, host = worker_app

    async def go():
        client = await WorkerClient.connect(HttpTransport(url))
        try:
            assert client.worker_id == "w0"
            info = await client.info()
            assert info.page_size == 16 and info.epoch == host.epoch and info.vocab_size == 320
            assert (await client.health()).ok is True
            first = await client.poll(-1, None)
            assert first.snapshot is True and first.epoch == host.epoch
            ids = list(range(40, 40 + 50))
            chunks = await _generate(client, ids, "h-1")
            final = chunks[-1]
            assert final.finish_reason == "length" and final.prompt_tokens == 50
            assert final.completion_tokens == 3 and final.cached_tokens == 0
            assert sum(len(c.token_ids) for c in chunks) == 3
            again = (await _generate(client, ids, "h-2"))[-1]
            assert again.cached_tokens == 48  # 3 full pages; the last token is recomputed
            resp = await client.poll(first.seq, first.epoch)
            assert resp.snapshot is False and resp.seq > first.seq
            stored = [
                h
                for e in decode_events(resp.events).events
                if isinstance(e, BlockStored)
                for h in e.block_hashes
            ]
            assert set(hash_blocks(ids, 16)) <= set(stored)
            assert resp.load.total_pages == 512  # the counters count both requests, exactly:
            assert resp.counters.prompt_tokens - first.counters.prompt_tokens == 100
            assert resp.counters.cached_tokens - first.counters.cached_tokens == 48
            # A long request aborted mid-stream frees its pages.
            agen = client.generate(
                GenerateRequest("h-3", list(range(1, 30)), SamplingParams(max_tokens=500))
            )
            await agen.__anext__()
            await client.abort("h-3")
            await agen.aclose()
            # The worker's own checks: one error channel, the kind and the field at fault.
            with pytest.raises(InvalidRequest, match=r"\[0, 320\)") as bad:
                await _generate(client, [999], "h-4")
            assert bad.value.param == "prompt"
            with pytest.raises(InvalidRequest, match="context length 4096") as bad:
                await _generate(client, [1] * 4000, "h-5", SamplingParams(max_tokens=200))
            assert bad.value.param == "max_tokens"
        finally:
            await client.close()

    asyncio.run(go())

    def left() -> int:  # requests still on the engine: decoding, queued or mid-prefill
        s = host.engine.stats()
        return s["running"] + s["waiting"]

    wait_for(lambda: left() == 0, "the aborted request leaving the engine")  # at a step boundary


def test_unreachable_worker_is_unavailable():
    async def go():
        client = WorkerClient(HttpTransport("http://127.0.0.1:9", connect_timeout_s=2), "gone")
        try:
            with pytest.raises(WorkerUnavailable, match="127.0.0.1:9"):
                await client.poll(-1, None)
            with pytest.raises(WorkerUnavailable):
                await _generate(client, [1, 2, 3], "x")
        finally:
            await client.close()

    asyncio.run(go())


def test_internal_routes_need_the_cluster_token(guarded_worker_app):
    url, host = guarded_worker_app
    body = encode(GenerateRequest("t-1", [5, 6, 7], GREEDY3))
    finished = host.engine.stats()["requests_finished"]
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": TOKEN}):
        for method, payload in (("generate", body), ("abort", b""), ("poll", b""), ("info", b"")):
            r = httpx.post(f"{url}/internal/{method}", content=payload, headers=headers)
            assert r.status_code == 401, (method, headers)
            assert r.json()["error"]["code"] == "invalid_token"
    assert host.engine.stats()["requests_finished"] == finished  # nothing ran

    async def go(token):
        client = WorkerClient(HttpTransport(url, token=token), "w1")
        try:
            return await _generate(client, [5, 6, 7], "t-2")
        finally:
            await client.close()

    with pytest.raises(WorkerUnavailable, match="401.*cluster token"):
        asyncio.run(go("wrong"))
    assert asyncio.run(go(TOKEN))[-1].finish_reason == "length"
    # The public face needs no token: health and the OpenAI API.
    assert httpx.get(f"{url}/health").status_code == 200
    r = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200 and r.headers["x-radixray-worker"] == "w1"


def test_bad_bodies_are_error_frames_and_unknown_methods_404(worker_app):
    url, _ = worker_app

    def post(method: str, payload: bytes) -> httpx.Response:
        return httpx.post(
            f"{url}/internal/{method}", content=payload, headers={"content-type": MSGPACK}
        )

    def error_of(r: httpx.Response) -> ErrorInfo:
        assert r.status_code == 200
        return decode_msg(r.content, ErrorInfo)

    err = error_of(post("info", b"\xc1 not msgpack"))
    assert err.kind is ErrorKind.INVALID_REQUEST and "msgpack" in err.message
    err = error_of(post("poll", encode(GenerateRequest("x", [1], GREEDY3))))
    assert "expected a poll message" in err.message
    # A stream answers its error as the one frame it sends.
    r = post(
        "generate", msgspec.msgpack.encode([f"generate/{PROTOCOL_VERSION}", "x", [1, -2], [3]])
    )
    frames = r.content
    assert r.status_code == 200 and int.from_bytes(frames[:4], "little") == len(frames) - 4
    err = decode_msg(frames[4:], ErrorInfo)
    assert err.kind is ErrorKind.INVALID_REQUEST and "$[2][1]" in err.message
    r = post("frobnicate", b"")
    assert r.status_code == 404 and "expected one of" in r.json()["error"]["message"]


def test_router_over_http_workers_routes_by_cache(worker_app, guarded_worker_app):
    urls = [worker_app[0], guarded_worker_app[0]]
    hosts = {"w0": worker_app[1], "w1": guarded_worker_app[1]}
    service = RouterService(
        load_model_meta("tiny"), RouterSettings(policy="ttft", page_size=16, poll_interval_s=0.05)
    )

    async def add_all():
        # A session belongs to the loop that uses it: connect on the server's.
        for u, token in zip(urls, (None, TOKEN), strict=True):
            await service.add_worker(await WorkerClient.connect(HttpTransport(u, token)))

    server = LiveServer(service)
    with server as url:
        server.call(add_all())
        assert sorted(service.pool.workers) == ["w0", "w1"]
        # ~600 tokens: their recomputation outweighs what a stale load report can in ttft's cost
        prompt = "radixray over http " * 32
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0}
        with httpx.Client(timeout=30) as http:
            r1 = http.post(url + "/v1/completions", json=body)
            assert r1.status_code == 200, r1.text
            # Until the router's latest report of that worker was taken after the request (its
            # KV events with it) and shows it idle again.
            first = r1.headers["x-radixray-worker"]
            entry, host = service.pool.workers[first], hosts[first]
            done = host.engine.report()[1].prompt_tokens

            def reported() -> bool:
                load = entry.report
                return entry.counters.prompt_tokens == done and load.running == load.waiting == 0

            wait_for(reported, f"a report of {first} counting the first request, idle")
            r2 = http.post(url + "/v1/completions", json=body)
        assert r2.headers["x-radixray-worker"] == first
        cached = r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached == (len(prompt) - 1) // 16 * 16  # all its whole pages but the last token's
        blocks = service.index.num_blocks(r1.headers["x-radixray-worker"])
        assert blocks >= len(prompt) // 16


def test_connections_are_kept_alive_and_reused(worker_app):
    url, _ = worker_app

    async def go():
        transport = HttpTransport(url)
        client = WorkerClient(transport, "w0")
        try:
            for i in range(5):  # streams read to their final chunk, and unary calls
                await _generate(client, [7, 8, 9, i], f"ka-{i}")
                await client.health()
            sequential = transport._open
            await asyncio.gather(*(_generate(client, [7, 8, i], f"kb-{i}") for i in range(4)))
            concurrent = transport._open
            # A stream left early closes its connection (the worker aborts the request).
            agen = client.generate(
                GenerateRequest("kc", list(range(1, 30)), SamplingParams(max_tokens=500))
            )
            await agen.__anext__()
            await agen.aclose()
            return sequential, concurrent, transport._open
        finally:
            await client.close()

    sequential, concurrent, after_early_close = asyncio.run(go())
    assert sequential == 1  # every call reused the one connection
    assert concurrent == 4  # one per request in flight, then kept
    assert after_early_close == 3  # the stream left early took one and closed it


def test_the_step_log_is_served_since_a_count(worker_app):
    url, host = worker_app

    async def go():
        client = await WorkerClient.connect(HttpTransport(url))
        try:
            big = {"since": 10**9, "ttft_since": 10**9}
            before = httpx.get(f"{url}/debug/steps", params=big).json()
            assert before["log"] == [] == before["ttft"] and before["worker_id"] == "w0"
            ids = list(range(60, 60 + 40))
            await _generate(client, ids, "steps-1", SamplingParams(max_tokens=4, temperature=0.0))
            return before["steps"], before["first_tokens"]
        finally:
            await client.close()

    seen, firsts = asyncio.run(go())
    body = httpx.get(f"{url}/debug/steps", params={"since": seen, "ttft_since": firsts}).json()
    # the one request's first token, timed inside the engine: its prompt, nothing cached
    assert body["first_tokens"] == firsts + 1 and len(body["ttft"]) == 1
    prompt, cached, ttft = body["ttft"][0]
    assert (prompt, cached) == (40, 0) and 0 < ttft < 60
    assert body["fields"][:4] == ["decode_batch", "decode_ctx", "prefill_tokens", "prefill_ctx_sum"]
    assert body["steps"] == seen + 4 == host.engine.meter.steps
    rows = [dict(zip(body["fields"], x, strict=True)) for x in body["log"]]
    # one 40-token prefill step, then three one-sequence decode steps at contexts 41..43
    assert [(r["prefill_tokens"], r["decode_batch"], r["decode_ctx"]) for r in rows] == [
        (40, 0, 0), (0, 1, 41), (0, 1, 42), (0, 1, 43)
    ]  # fmt: skip
    assert all(0 < r["seconds"] <= r["period_s"] for r in rows)
    for name in ("since", "ttft_since"):
        bad = httpx.get(f"{url}/debug/steps", params={name: "-1"})
        assert bad.status_code == 400
        err = bad.json()["error"]
        assert err["param"] == name and err["message"] == f"{name} must be an int >= 0, got '-1'"
