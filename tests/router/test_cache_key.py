"""OpenAI's ``prompt_cache_key`` end to end: through a real router over two in-process workers,
requests that tie (cold prompts on idle workers) go where their key hashes with the worker ids,
on chat, completions and responses alike; without a key, ties spread."""

from __future__ import annotations

import itertools
import string

import httpx
import pytest
import xxhash

from .serving import LiveServer, inprocess_service


@pytest.fixture(scope="module")
def http():
    """A client of the router (one, kept alive: a client a request cost more than the request)."""
    # Pages of 8 tokens: the chat template's header (6 of the byte tokenizer's tokens) fills
    # no page of its own, so no worker holds a page every chat shares.
    service, hosts, clients = inprocess_service(2, page_size=8, policy="ttft")
    with LiveServer(service, clients) as u, httpx.Client(base_url=u, timeout=60) as client:
        yield client
    for h in hosts:
        h.shutdown()


_FIRST = itertools.count()
_ALPHABET = string.ascii_letters + string.digits


def _home(key: str) -> str:
    """The worker a key's ties go to: the highest hash of key and worker id."""
    return max(("w0", "w1"), key=lambda w: xxhash.xxh64_intdigest(f"{key}\0{w}".encode()))


def _send(http: httpx.Client, route: str, key: str | None, i: int) -> str:
    # A prompt no worker holds from its first page on (its first two characters its own).
    n = next(_FIRST)
    text = _ALPHABET[n % 62] + _ALPHABET[n // 62 % 62] + f" {i}:{key}: a cold prompt" * 20
    if route == "/v1/completions":
        body = {"prompt": text, "max_tokens": 1}
    elif route == "/v1/chat/completions":
        body = {"messages": [{"role": "user", "content": text}], "max_tokens": 1}
    else:
        body = {"input": text, "max_output_tokens": 1, "store": False}
    if key is not None:
        body["prompt_cache_key"] = key
    r = http.post(route, json={"model": "tiny"} | body)
    assert r.status_code == 200, r.text
    return r.headers["x-radixray-worker"]


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions", "/v1/responses"])
def test_a_keys_ties_go_where_its_key_hashes(http, route):
    # Two keys whose homes differ, so the test tells the key's worker from any fixed one.
    keys = [k for k in (f"tenant-{n}" for n in range(20)) if _home(k) == "w0"][:1]
    keys += [k for k in (f"tenant-{n}" for n in range(20)) if _home(k) == "w1"][:1]
    for i in range(4):  # one after another: each finds both workers idle again
        for key in keys:
            assert _send(http, route, key, i) == _home(key)


def test_without_a_key_ties_spread(http):
    assert {_send(http, "/v1/completions", None, i) for i in range(12)} == {"w0", "w1"}
