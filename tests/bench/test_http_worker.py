"""HttpWorkerClient (the WorkerClient protocol over HTTP) against real worker apps, and the
router fronting worker processes through it (what `radixray serve --worker-urls` runs)."""

from __future__ import annotations

import asyncio
import time

import httpx
import msgpack
import pytest

from radixray.cache_index import hash_blocks
from radixray.cache_index.events import BlockStored, decode
from radixray.router.http_worker import MSGPACK, HttpWorkerClient, pack_ids, unpack_ids
from radixray.router.model_meta import load_model_meta
from radixray.router.service import RouterService, RouterSettings
from radixray.router.worker_client import WorkerUnavailable
from tests.router.serving import LiveServer

PARAMS = {"max_tokens": 3, "temperature": 0.0}


async def _generate(client, ids, rid, params=PARAMS):
    return [c async for c in client.generate(ids, params, rid)]


def test_info_generate_poll_abort(worker_app):
    url, host = worker_app

    async def go():
        client = await HttpWorkerClient.connect(url)
        try:
            assert client.worker_id == "w0"
            info = await client.info()
            assert info["page_size"] == 16 and info["epoch"] == host.epoch
            assert (await client.health())["ok"] is True
            first = await client.poll(-1, None)
            assert first["snapshot"] is True and first["epoch"] == host.epoch
            ids = list(range(40, 40 + 50))
            chunks = await _generate(client, ids, "h-1")
            final = chunks[-1]
            assert final["finish_reason"] == "length" and final["prompt_tokens"] == 50
            assert final["completion_tokens"] == 3 and final["cached_tokens"] == 0
            again = (await _generate(client, ids, "h-2"))[-1]
            assert again["cached_tokens"] == 48  # 3 full pages; the last token is recomputed
            resp = await client.poll(first["seq"], first["epoch"])
            assert resp["snapshot"] is False and resp["seq"] > first["seq"]
            stored = [
                h
                for e in decode(resp["events"]).events
                if isinstance(e, BlockStored)
                for h in e.block_hashes
            ]
            assert set(hash_blocks(ids, 16)) <= set(stored)
            assert resp["load"]["total_pages"] == 512
            # A long request aborted mid-stream frees its pages.
            agen = client.generate(list(range(1, 30)), {"max_tokens": 500}, "h-3")
            await agen.__anext__()
            await client.abort("h-3")
            await agen.aclose()
            bad = await _generate(client, [999], "h-4")
            assert bad[-1]["finish_reason"] == "error" and "prompt_ids" in bad[-1]["error"]
            bad = await _generate(client, [1, 2], "h-5", {"max_tokens": 0})
            assert bad[-1]["finish_reason"] == "error" and "max_tokens" in bad[-1]["error"]
        finally:
            await client.close()

    asyncio.run(go())
    for _ in range(100):  # the abort lands at the next step boundary
        if host.engine.stats()["running"] == 0:
            break
        time.sleep(0.05)
    assert host.engine.stats()["running"] == 0


def test_unreachable_worker_is_unavailable():
    async def go():
        client = HttpWorkerClient("http://127.0.0.1:9", "gone", call_timeout_s=2)
        try:
            with pytest.raises(WorkerUnavailable, match="gone"):
                await client.poll(-1, None)
            with pytest.raises(WorkerUnavailable):
                await _generate(client, [1, 2, 3], "x")
        finally:
            await client.close()

    asyncio.run(go())


def test_router_over_http_workers_routes_by_cache(worker_app, second_worker_app):
    urls = [worker_app[0], second_worker_app[0]]
    service = RouterService(
        load_model_meta("tiny"), RouterSettings(policy="ttft", page_size=16, poll_interval_s=0.05)
    )

    # HttpWorkerClient sessions belong to the loop that uses them: connect on the server's.
    server = LiveServer(service)
    with server as url:
        server.call(_add_all(service, urls))
        assert sorted(service.pool.workers) == ["w0", "w1"]
        prompt = "radixray over http " * 8
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0}
        with httpx.Client(timeout=30) as http:
            r1 = http.post(url + "/v1/completions", json=body)
            assert r1.status_code == 200, r1.text
            server.call(asyncio.sleep(0.3))  # the KV events of the first request arrive
            r2 = http.post(url + "/v1/completions", json=body)
        assert r2.headers["x-radixray-worker"] == r1.headers["x-radixray-worker"]
        assert r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 144
        blocks = service.index.num_blocks(r1.headers["x-radixray-worker"])
        assert blocks >= len(prompt) // 16


async def _add_all(service, urls):
    for u in urls:
        await service.add_worker(await HttpWorkerClient.connect(u))


def test_packed_token_ids_round_trip_and_bad_bodies_are_400(worker_app):
    url, _ = worker_app
    ids = [0, 1, 255, 256, 49151, 2**31 - 1]
    assert unpack_ids(pack_ids(ids)) == ids
    with pytest.raises(ValueError, match="int32"):
        pack_ids([2**31])
    with pytest.raises(ValueError, match="multiple of 4"):
        unpack_ids(b"\x00" * 5)

    def post(body: dict) -> httpx.Response:
        return httpx.post(
            f"{url}/internal/generate",
            content=msgpack.packb(body),
            headers={"content-type": MSGPACK},
            timeout=30,
        )

    good = {"prompt_ids": pack_ids([5, 6, 7]), "params": PARAMS, "request_id": "pk1"}
    r = post(good)
    assert r.status_code == 200 and '"finish_reason":"length"' in r.text
    r = post(good | {"request_id": "pk2", "prompt_ids": b"\x01\x02\x03\x04\x05"})
    assert r.status_code == 400 and "multiple of 4" in r.text
    r = post(good | {"request_id": "pk3", "prompt_ids": pack_ids([5, 10**6])})
    assert r.status_code == 400 and "prompt_ids" in r.text
    r = httpx.post(f"{url}/internal/generate", content=b"\xc1", headers={"content-type": MSGPACK})
    assert r.status_code == 400 and "msgpack" in r.text


def test_a_worker_that_only_takes_json_is_spoken_json_to(worker_app, monkeypatch):
    # A worker from before the msgpack hop (its generate route parsed JSON only), served by the
    # real app with the old parser in place: the client falls back to JSON and stays there.
    from radixray.router.routes_sglang import WorkerEdge

    json_only = WorkerEdge._parse_generate
    monkeypatch.setattr(
        WorkerEdge, "_parse_generate", lambda self, raw, packed=False: json_only(self, raw)
    )
    url, _ = worker_app

    async def go():
        client = await HttpWorkerClient.connect(url)
        try:
            first = await _generate(client, [5, 6, 7, 8], "old1")
            second = await _generate(client, [5, 6, 7, 8], "old2")
            return first, second, client._packed
        finally:
            await client.close()

    first, second, packed = asyncio.run(go())
    assert first[-1]["finish_reason"] == "length" and second[-1]["finish_reason"] == "length"
    assert not packed
