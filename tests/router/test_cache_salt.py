"""Tenant isolation with ``cache_salt``: requests with different salts never share cached pages,
on the worker (its prefix cache is namespaced by the salt) nor in the router's index (whose
block hashes are salted the same way), so one tenant can neither reuse nor time another's
prefixes. Through the real router app over HTTP and real in-process engines (tiny model: one
character is one token; pages of 16 tokens)."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from radixray.cache_index import hash_blocks

from .serving import LiveServer, inprocess_service

P = 16
PROMPT = ("tenant isolation: the same long system prompt for everyone. " * 4)[:200]
FULL_PAGES = (len(PROMPT) - 1) // P * P  # what a repeat can reuse: 192 tokens
C = "/v1/completions"
CH = "/v1/chat/completions"


def oai(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60)


def complete(client: openai.OpenAI, salt: str | None, prompt: str = PROMPT):
    """One completion; returns (its id, the worker, usage's cached tokens, the header's)."""
    extra = {"cache_salt": salt} if salt is not None else None
    raw = client.completions.with_raw_response.create(
        model="tiny", prompt=prompt, max_tokens=2, temperature=0, extra_body=extra
    )
    assert raw.status_code == 200
    resp = raw.parse()
    assert resp.usage.prompt_tokens == len(prompt)
    return (
        resp.id,
        raw.headers["x-radixray-worker"],
        resp.usage.prompt_tokens_details.cached_tokens,
        raw.headers["x-radixray-cached-tokens"],
    )


def decision(http: httpx.Client, url: str, request_id: str) -> dict:
    recs = http.get(f"{url}/debug/decisions?limit=1000").json()["decisions"]
    (rec,) = [d for d in recs if d["request_id"] == request_id]
    return rec


def worker_blocks(host) -> set[int]:
    """The worker's own cached block hashes (its KV events, as a snapshot)."""
    return {h for ev in host.engine.snapshot_events() for h in getattr(ev, "block_hashes", [])}


async def resync_from_snapshot(service, worker_id: str) -> None:
    """Forget the router's view of a worker and rebuild it from one snapshot poll (the pool's
    own polls stopped first, so that nothing else feeds the index meanwhile)."""
    await service.pool.stop()
    entry = service.pool.workers[worker_id]
    service.index.clear(worker_id)
    entry.epoch = None  # a poll without the worker's epoch is answered with a snapshot
    await service.pool.poll_once()


def settle(hosts, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while any(h.engine.stats()["running"] or h.engine.stats()["waiting"] for h in hosts):
        assert time.monotonic() < deadline, [h.engine.stats() for h in hosts]
        time.sleep(0.02)
    for h in hosts:
        h.engine.check_integrity()
        assert h.engine.cache.protected_tokens == 0


def test_salts_never_share_cached_pages_on_one_worker():
    # One worker: routing cannot explain a miss.
    service, hosts, clients = inprocess_service(1, page_size=P)
    ids = service.meta.tokenizer.encode(PROMPT)
    assert len(ids) == len(PROMPT) == 200 and FULL_PAGES == 192
    try:
        server = LiveServer(service, clients)
        with server as url, httpx.Client(timeout=60) as http:
            client = oai(url)
            a1 = complete(client, "tenant-a")
            assert a1[1:] == ("w0", 0, "0")  # cold
            b = complete(client, "tenant-b")
            assert b[1:] == ("w0", 0, "0")  # the same prompt, another tenant: nothing reused
            a2 = complete(client, "tenant-a")
            assert a2[1:] == ("w0", FULL_PAGES, str(FULL_PAGES))  # its own pages are reused
            plain = complete(client, None)
            assert plain[1:] == ("w0", 0, "0")  # no salt is a namespace of its own
            again = complete(client, None)
            assert again[1:] == ("w0", FULL_PAGES, str(FULL_PAGES))

            # The router predicted exactly that: no hit for tenant-b on tenant-a's pages.
            predicted = {
                name: decision(http, url, rid)["predicted_cached_tokens"]
                for name, rid in [("a1", a1[0]), ("b", b[0]), ("a2", a2[0]), ("plain", plain[0])]
            }
            assert predicted == {"a1": 0, "b": 0, "a2": FULL_PAGES, "plain": 0}
            assert decision(http, url, b[0])["actual_cached_tokens"] == 0
            assert http.get(f"{url}/debug/decisions").json()["mispredictions"] == 0

            # The worker hashes its pages per salt, and the router's index (fed by the worker's
            # KV events) holds the same hashes: three disjoint chains of 12 pages.
            chains = {
                salt: set(hash_blocks(ids, P, extra_key=salt))
                for salt in ("tenant-a", "tenant-b", None)
            }
            assert all(len(c) == FULL_PAGES // P for c in chains.values())
            a, b_, none = chains.values()
            assert not (a & b_) and not (a & none) and not (b_ & none)
            truth = worker_blocks(hosts[0])
            assert truth == a | b_ | none
            deadline = time.monotonic() + 60  # a guard against a hang only
            while service.index.blocks("w0") != truth:
                assert time.monotonic() < deadline, (service.index.blocks("w0"), truth)
                time.sleep(0.02)
            # The router inserted its own hashes when it dispatched; drop them and rebuild the
            # index from the worker's events alone: the very same hashes.
            entry = service.pool.workers["w0"]
            snapshots = entry.snapshots
            server.call(resync_from_snapshot(service, "w0"))
            assert entry.snapshots == snapshots + 1
            assert service.index.blocks("w0") == truth
        settle(hosts)
    finally:
        for h in hosts:
            h.shutdown()


@pytest.mark.parametrize("policy", ["cache_aware", "ttft"])
def test_router_does_not_predict_a_hit_on_another_tenants_cache(policy):
    service, hosts, clients = inprocess_service(2, page_size=P, policy=policy)
    try:
        with LiveServer(service, clients) as url, httpx.Client(timeout=60) as http:
            client = oai(url)
            rid_a, home, cached, _ = complete(client, "tenant-a")
            assert cached == 0
            rid_b, _, cached, header = complete(client, "tenant-b")
            rec = decision(http, url, rid_b)
            assert rec["predicted_cached_tokens"] == 0, rec
            assert (cached, header, rec["actual_cached_tokens"]) == (0, "0", 0)
            if policy == "cache_aware":  # its scores are matched pages per worker
                assert rec["scores"] == {"w0": 0, "w1": 0}, rec
            # The same tenant again is predicted to hit, and does.
            rid_a2, worker, cached, _ = complete(client, "tenant-a")
            rec = decision(http, url, rid_a2)
            assert (worker, rec["predicted_cached_tokens"], cached) == (
                home,
                FULL_PAGES,
                FULL_PAGES,
            ), rec
        settle(hosts)
    finally:
        for h in hosts:
            h.shutdown()


def repeat_hit(service, msgs) -> int:
    """What a repeat of a chat reuses, exactly: every whole page of its prompt (as the chat
    template renders it) but the last token's."""
    tok = service.meta.tokenizer
    ids = tok.encode(tok.apply_chat_template(msgs, add_generation_prompt=True))
    return (len(ids) - 1) // P * P


def test_chat_completions_take_cache_salt_and_bad_salts_are_400():
    service, hosts, clients = inprocess_service(1, page_size=P)
    msgs = [{"role": "system", "content": PROMPT}, {"role": "user", "content": "hello"}]
    try:
        with LiveServer(service, clients) as url, httpx.Client(timeout=60) as http:
            client = oai(url)

            def chat(salt: str) -> tuple[int, str]:
                raw = client.chat.completions.with_raw_response.create(
                    model="tiny",
                    messages=msgs,
                    max_tokens=2,
                    temperature=0,
                    extra_body={"cache_salt": salt},
                )
                assert raw.status_code == 200
                resp = raw.parse()
                return (
                    resp.usage.prompt_tokens_details.cached_tokens,
                    raw.headers["x-radixray-cached-tokens"],
                )

            repeat = repeat_hit(service, msgs)
            assert repeat > FULL_PAGES  # the system prompt and the user turn
            assert chat("tenant-a") == (0, "0")
            assert chat("tenant-b") == (0, "0")
            assert chat("tenant-a") == (repeat, str(repeat))

            # Streaming: the header and the usage chunk say the same.
            def stream(salt: str) -> tuple[int, str]:
                body = {
                    "model": "tiny",
                    "messages": msgs,
                    "max_tokens": 2,
                    "temperature": 0,
                    "cache_salt": salt,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                usage = None
                with http.stream("POST", url + CH, json=body) as r:
                    assert r.status_code == 200
                    for line in r.iter_lines():
                        if line.startswith("data: {"):
                            usage = json.loads(line[6:]).get("usage") or usage
                assert usage is not None
                header = r.headers["x-radixray-cached-tokens"]
                return usage["prompt_tokens_details"]["cached_tokens"], header

            assert stream("tenant-c") == (0, "0")
            assert stream("tenant-c") == (repeat, str(repeat))

            # Bad salts name the field, on both routes.
            cases = [("", "at least 1 character"), ("s" * 300, "at most 256 characters")]
            for route, base in [
                (C, {"model": "tiny", "prompt": "x"}),
                (CH, {"model": "tiny", "messages": msgs}),
            ]:
                for salt, why in cases:
                    r = http.post(url + route, json=base | {"cache_salt": salt})
                    assert r.status_code == 400, r.text
                    err = r.json()["error"]
                    assert err["type"] == "invalid_request_error" and err["param"] == "cache_salt"
                    assert "cache_salt" in err["message"] and why in err["message"], err
                r = http.post(url + route, json=base | {"cache_salt": 5})
                assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"
            with pytest.raises(openai.BadRequestError) as ei:
                client.completions.create(
                    model="tiny", prompt="x", max_tokens=2, extra_body={"cache_salt": ""}
                )
            assert ei.value.param == "cache_salt"
            # A salt of exactly 256 characters is fine.
            r = http.post(url + C, json={"model": "tiny", "prompt": "x", "cache_salt": "s" * 256})
            assert r.status_code == 200, r.text
        settle(hosts)
    finally:
        for h in hosts:
            h.shutdown()
