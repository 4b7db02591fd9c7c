"""Reuse telemetry through the real router app and real in-process engines: every decision in
/debug/decisions carries the reuse available (the longest prefix any worker held, by the index)
and captured (what the chosen worker held), its final chunk the reuse delivered; /metrics sums
them. Round robin over two workers sends a repeat away from its prefix, so available and
captured come apart."""

from __future__ import annotations

import re

import httpx

from .serving import LiveServer, inprocess_service
from .test_cache_salt import FULL_PAGES, P, complete, decision, oai, settle


def metric(text: str, name: str, label: str) -> float:
    m = re.search(rf'^{name}_total\{{\w+="{label}"\}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def test_available_captured_and_delivered_reuse_per_decision_and_in_metrics():
    service, hosts, clients = inprocess_service(2, page_size=P, policy="round_robin")
    try:
        with LiveServer(service, clients) as url, httpx.Client(timeout=60) as http:
            client = oai(url)
            first = complete(client, None)
            second = complete(client, None)  # round robin: the other worker, which has nothing
            third = complete(client, None)  # back on the first worker, which holds the prompt
            recs = [decision(http, url, r[0]) for r in (first, second, third)]
            assert recs[1]["worker_id"] != recs[0]["worker_id"] == recs[2]["worker_id"]
            got = [
                (r["available_tokens"], r["captured_tokens"], r["actual_cached_tokens"])
                for r in recs
            ]
            assert got == [(0, 0, 0), (FULL_PAGES, 0, 0), (FULL_PAGES, FULL_PAGES, FULL_PAGES)]
            text = http.get(f"{url}/metrics").text
            assert metric(text, "radixray_reuse_tokens", "available") == 2 * FULL_PAGES
            assert metric(text, "radixray_reuse_tokens", "captured") == FULL_PAGES
            assert metric(text, "radixray_reuse_tokens", "delivered") == FULL_PAGES
            for direction in ("over", "under"):
                assert metric(text, "radixray_reuse_misprediction_tokens", direction) == 0
        settle(hosts)
    finally:
        for h in hosts:
            h.shutdown()
