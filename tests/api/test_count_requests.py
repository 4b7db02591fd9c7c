"""``CountRequests`` counts each response once under its route template and status, its
(route, status) children kept after their first look-up."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from prometheus_client import CollectorRegistry, Counter

from radixray.api import CountRequests


def test_each_response_counts_once_under_its_route_and_status():
    registry = CollectorRegistry()
    counter = Counter("requests", "by route", ["route", "status"], registry=registry)

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        scope["route"] = SimpleNamespace(path=scope["path"]) if scope["path"] != "/x" else None
        await send({"type": "http.response.start", "status": 404 if scope["path"] == "/x" else 200})

    async def send(message):
        pass

    async def run():
        count = CountRequests(app, counter)
        for path in ("/a", "/a", "/x", "/b", "/a"):
            await count({"type": "http", "path": path}, None, send)
        await count({"type": "lifespan"}, None, send)  # not http: not counted

    asyncio.run(run())
    got = {
        (s.labels["route"], s.labels["status"]): s.value
        for s in next(iter(registry.collect())).samples
        if s.name == "requests_total"
    }
    assert got == {("/a", "200"): 3.0, ("unmatched", "404"): 1.0, ("/b", "200"): 1.0}
