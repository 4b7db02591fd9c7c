"""A body over the limit is answered 413 naming the limit, and the client receives that answer:
the edge reads the body to its end (up to a cap) before answering, instead of answering and
closing with the upload still arriving (a reset: the client never reads the 413, and the
official OpenAI client sends the whole upload again). Checked on the ASGI messages themselves,
with the official client, and with a raw socket, against the router's edge and a worker's own
HTTP server."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx
import openai
import pytest

from radixray.api import BodyLimit
from radixray.api.body import BodyTooLarge, read_body

from ..router.serving import served

LIMIT = 4 << 20  # the router's and the worker's default
BIG = 5 << 20  # a long prompt, over the limit


# ---------------------------------------------------------------------- the ASGI messages


class Upload:
    """An ASGI ``receive`` that hands out a body in ``chunks`` pieces, and logs every message
    received and sent, in order."""

    def __init__(self, chunks: list[bytes]):
        self.chunks = list(chunks)
        self.log: list[str] = []

    async def receive(self):
        if not self.chunks:
            self.log.append("receive:disconnect")
            return {"type": "http.disconnect"}
        body = self.chunks.pop(0)
        self.log.append(f"receive:{len(body)}")
        return {"type": "http.request", "body": body, "more_body": bool(self.chunks)}

    async def send(self, message):
        if message["type"] == "http.response.start":
            self.log.append(f"send:{message['status']}")


def _scope(headers: list[tuple[bytes, bytes]]) -> dict:
    return {"type": "http", "method": "POST", "path": "/v1/completions", "headers": headers}


async def _never_called(scope, receive, send):
    raise AssertionError("an oversized body reached the app")


def test_an_oversized_body_is_read_to_its_end_before_the_413():
    up = Upload([b"x" * 400] * 5)
    scope = _scope([(b"content-length", b"2000")])
    asyncio.run(BodyLimit(_never_called, limit=1000)(scope, up.receive, up.send))
    assert up.log == ["receive:400"] * 5 + ["send:413"]


def test_a_chunked_upload_over_the_limit_is_read_to_its_end_before_the_413():
    up = Upload([b"x" * 400] * 5)
    asyncio.run(BodyLimit(_never_called, limit=1000)(_scope([]), up.receive, up.send))
    assert up.log == ["receive:400"] * 5 + ["send:413"]


def test_read_body_raises_after_draining_and_names_the_limit():
    up = Upload([b"x" * 400] * 5)
    with pytest.raises(BodyTooLarge) as e:
        asyncio.run(read_body(up.receive, 1000))
    assert up.log == ["receive:400"] * 5
    assert e.value.message == "request body exceeds the 1000-byte limit"
    assert BodyTooLarge(1000, 2000).message == "request body is 2000 bytes; the limit is 1000"


def test_read_body_whole_and_client_gone():
    assert asyncio.run(read_body(Upload([b"ab", b"cd"]).receive, 4)) == b"abcd"
    up = Upload([])
    assert asyncio.run(read_body(up.receive)) is None
    assert up.log == ["receive:disconnect"]


# ---------------------------------------------------------------------- live servers


@pytest.fixture(scope="module", params=["router", "worker"])
def url(request):
    with served(request.param, n_workers=1) as (u, _):
        yield u


def test_the_official_client_receives_the_413_and_does_not_retry(url):
    sent = []
    http = httpx.Client(event_hooks={"request": [sent.append]}, timeout=60)
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=2, http_client=http)
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(model="tiny", prompt="a" * BIG, max_tokens=1)
    assert e.value.status_code == 413
    assert f"the limit is {LIMIT}" in e.value.message
    assert len(sent) == 1  # a 413 is final: no retry sends the upload again
    with pytest.raises(openai.APIStatusError) as e:
        messages = [{"role": "user", "content": "a" * BIG}]
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=1)
    assert e.value.status_code == 413
    assert len(sent) == 2
    # and the same server goes on answering
    answer = client.completions.create(model="tiny", prompt="still here", max_tokens=2)
    assert answer.usage.completion_tokens == 2


def _raw_post(url: str, head: bytes, pieces: list[bytes]) -> tuple[bytes, dict, dict]:
    """Send a request's head, then its body piece by piece, then read the whole answer (the
    connection asks to be closed after it): (status line, headers, JSON body)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(head)
        for p in pieces:
            s.sendall(p)  # raises (a reset) if the server closed before reading the body
        data = b""
        while chunk := s.recv(1 << 16):
            data += chunk
    top, _, body = data.partition(b"\r\n\r\n")
    status, *lines = top.split(b"\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (x.partition(b":") for x in lines)}
    assert int(headers[b"content-length"]) == len(body)  # the whole answer arrived
    return status, headers, json.loads(body)


def test_a_raw_upload_with_a_length_over_the_limit_gets_a_whole_413(url):
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n" % BIG
    )
    status, _, body = _raw_post(url, head, [b"x" * (1 << 20)] * (BIG >> 20))
    assert status.startswith(b"HTTP/1.1 413 ")
    assert body["error"]["message"] == f"request body is {BIG} bytes; the limit is {LIMIT}"


def test_a_raw_chunked_upload_over_the_limit_gets_a_whole_413(url):
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    piece = b"%x\r\n%s\r\n" % (1 << 20, b"x" * (1 << 20))
    status, _, body = _raw_post(url, head, [piece] * (BIG >> 20) + [b"0\r\n\r\n"])
    assert status.startswith(b"HTTP/1.1 413 ")
    assert body["error"]["message"] == f"request body exceeds the {LIMIT}-byte limit"


def test_a_worker_internal_route_answers_413_naming_the_limit(worker_app):
    url, _ = worker_app
    head = (
        b"POST /internal/generate HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Content-Type: application/msgpack\r\nContent-Length: %d\r\n\r\n" % BIG
    )
    status, _, body = _raw_post(url, head, [b"x" * (1 << 20)] * (BIG >> 20))
    assert status.startswith(b"HTTP/1.1 413 ")
    assert body["error"] == {
        "message": f"request body exceeds the {LIMIT}-byte limit",
        "type": "invalid_request_error",
        "param": None,
        "code": "too_large",
    }
