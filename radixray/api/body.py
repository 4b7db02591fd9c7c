"""Reading a request's body off an ASGI ``receive``: the one loop every part of the edge uses
(the body limit, the OpenAI routes, a worker's internal routes, the SGLang field filter).

A body over the limit is read to its end (up to ``DISCARD_CAP`` bytes) and thrown away before
the 413 is sent. Answering first and closing with the upload still arriving resets the
connection: the client, still writing, never reads the 413, and the official OpenAI client then
sends the whole upload again. A body past the cap is left to the server, which drops what
follows the answer (uvicorn keeps reading a kept-alive connection to the end of the request).
"""

from __future__ import annotations

__all__ = [
    "DISCARD_CAP",
    "BodyTooLarge",
    "declared_length",
    "discard_body",
    "read_body",
    "replay_body",
]

# How much of an oversized body is read and thrown away before answering 413: a long prompt's
# worth many times over, little CPU (the bytes are not kept).
DISCARD_CAP = 64 << 20


class BodyTooLarge(Exception):
    """A body over ``limit`` bytes. ``declared``: its Content-Length, when it sent one."""

    def __init__(self, limit: int, declared: int | None = None):
        self.limit = limit
        self.declared = declared
        if declared is not None:
            message = f"request body is {declared} bytes; the limit is {limit}"
        else:
            message = f"request body exceeds the {limit}-byte limit"
        super().__init__(message)
        self.message = message


def declared_length(scope) -> int | None:
    """The request's Content-Length (None when absent); ValueError when it is not a number."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            if not value.isdigit():
                raise ValueError(f"invalid Content-Length header: {value[:40]!r}")
            return int(value)
    return None


async def read_body(receive, limit: int | None = None) -> bytes | None:
    """The whole body, or None when the client left before sending it. Over ``limit`` bytes:
    the rest is read and discarded (up to ``DISCARD_CAP``), then ``BodyTooLarge`` is raised."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None  # the client left before sending its body
        body += message.get("body", b"")
        more = message.get("more_body", False)
        if limit is not None and len(body) > limit:
            if more:
                await discard_body(receive, DISCARD_CAP - len(body))
            raise BodyTooLarge(limit)
        if not more:
            return bytes(body)


async def discard_body(receive, cap: int = DISCARD_CAP) -> None:
    """Read and drop the rest of the body, up to ``cap`` bytes (or until the client leaves)."""
    seen = 0
    while seen < cap:
        message = await receive()
        if message["type"] != "http.request":
            return
        seen += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def replay_body(data: bytes, receive):
    """A ``receive`` that hands the app an already-read body once, then the real channel (a
    disconnect must still reach the app)."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": data, "more_body": False}
        return await receive()

    return replay
