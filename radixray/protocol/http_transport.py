"""The worker protocol over HTTP: what ``radixray serve --worker-urls`` uses to reach
``radixray worker`` processes (the server side is ``radixray.worker.http_server``).

    POST /internal/<method>    body: the encoded request (content-type application/msgpack)
      unary  -> 200, body: the encoded reply (or ErrorInfo)
      stream -> 200, body: frames, each a 4-byte little-endian length and an encoded chunk
    401 without the cluster token (``Authorization: Bearer <token>``) when the worker has one

The client is a small HTTP/1.1 client of its own over keep-alive connections, with the
response parsed by httptools (llhttp, in C): this hop is every routed request's, and a general
client (aiohttp) spent ~100 us a request on this CPU in Python (cookies, redirects, URL
objects, timeouts per request) that this hop does not need. A request is one write of
prebuilt headers and the body; a connection serves one request at a time and goes back to its
pool when the response has been read to its end. A stream closed early closes its connection:
the worker sees the disconnect and aborts the request.
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httptools

from .errors import WorkerUnavailable

__all__ = ["HttpTransport", "MSGPACK", "FRAMES", "frame", "INTERNAL_PREFIX"]

MSGPACK = "application/msgpack"
FRAMES = "application/x-radixray-frames"
INTERNAL_PREFIX = "/internal/"
_LEN = struct.Struct("<I")
# A reader that falls this far behind its stream stops reading the socket until it catches up
# (TCP then pushes back on the worker).
_HIGH_WATER = 1 << 20
_MAX_IDLE = 256  # connections kept open per worker


def frame(payload: bytes) -> bytes:
    """One frame of a streamed reply: length, then the encoded message."""
    return _LEN.pack(len(payload)) + payload


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; one request at a time. Parser callbacks fill the
    response state; the request's coroutine waits on ``_wait()`` for more of it."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers_done = False
        self.done = False
        self.keep_alive = False
        self.error: WorkerUnavailable | None = None
        self.framed = False
        self.buf = bytearray()
        self.frames: deque[bytes] = deque()
        self._waiter: asyncio.Future | None = None
        self._paused = False

    # -- asyncio.Protocol

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self.fail(f"unparsable HTTP response: {e}")
            self.close()

    def connection_lost(self, exc) -> None:
        self.closed = True
        if not self.done:
            self.fail(f"connection lost{f': {exc}' if exc else ''}")

    # -- httptools callbacks

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.buf += body
        if self.framed:
            self._split()
        if not self._paused and len(self.buf) + 64 * len(self.frames) > _HIGH_WATER:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()  # only meaningful until the next one
        self.done = True
        self._wake()

    # -- the request's side

    def fail(self, why: str) -> None:
        if self.error is None:
            self.error = WorkerUnavailable(why)
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(None)

    async def _wait(self) -> None:
        self._waiter = self.loop.create_future()
        await self._waiter

    def send(self, data: bytes) -> None:
        self._reset()
        self.transport.write(data)

    async def headers(self) -> int:
        while not self.headers_done:
            if self.error is not None:
                raise self.error
            await self._wait()
        return self.status

    async def body(self) -> bytes:
        while not self.done:
            if self.error is not None:
                raise self.error
            await self._wait()
        body = bytes(self.buf)
        self.buf.clear()
        return body

    def start_frames(self) -> None:
        self.framed = True
        self._split()

    def _split(self) -> None:
        buf, pos, n = self.buf, 0, len(self.buf)
        while n - pos >= 4:
            (size,) = _LEN.unpack_from(buf, pos)
            if n - pos - 4 < size:
                break
            self.frames.append(bytes(buf[pos + 4 : pos + 4 + size]))
            pos += 4 + size
        if pos:
            del buf[:pos]

    async def next_frame(self) -> bytes | None:
        """The next frame of a streamed body; None after the last."""
        while True:
            if self.frames:
                if self._paused and len(self.buf) + 64 * len(self.frames) < _HIGH_WATER // 2:
                    self._paused = False
                    self.transport.resume_reading()
                return self.frames.popleft()
            if self.done:
                if self.buf:
                    raise WorkerUnavailable("stream cut inside a frame")
                return None
            if self.error is not None:
                raise self.error
            await self._wait()

    @property
    def reusable(self) -> bool:
        return self.done and self.keep_alive and not self.closed

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.close()


class HttpTransport:
    """One worker at ``base_url`` (``http://host:port``). Connections are opened on first use,
    in the event loop that uses them. ``token``: the cluster token the worker requires (None:
    none)."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        connect_timeout_s: float = 10.0,
        stream_timeout_s: float = 600.0,
        max_connections: int = 512,
    ):
        self.base_url = base_url.rstrip("/")
        self.address = self.base_url
        url = urlsplit(self.base_url)
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"worker URL must be http://host:port, got {base_url!r}")
        self._host, self._port = url.hostname, url.port or 80
        self.connect_timeout_s = connect_timeout_s
        self.stream_timeout_s = stream_timeout_s
        self.max_connections = max_connections
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        self._head = (
            f"HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: {MSGPACK}\r\n{auth}Content-Length: "
        ).encode()
        self._idle: list[_Connection] = []
        self._open = 0
        self._slots: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _down(self, what: str) -> WorkerUnavailable:
        return WorkerUnavailable(f"worker at {self.base_url}: {what}")

    def _request(self, method: str, payload: bytes) -> bytes:
        path = f"POST {INTERNAL_PREFIX}{method} ".encode()
        return b"".join((path, self._head, str(len(payload)).encode(), b"\r\n\r\n", payload))

    async def _acquire(self) -> _Connection:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # connections belong to the loop that opened them
            self._idle, self._open, self._loop = [], 0, loop
            self._slots = asyncio.Semaphore(self.max_connections)
        await self._slots.acquire()
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
            self._open -= 1
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(loop), self._host, self._port),
                self.connect_timeout_s,
            )
        except (OSError, asyncio.TimeoutError) as e:
            self._slots.release()
            raise self._down(f"cannot connect: {type(e).__name__}: {e}") from None
        self._open += 1
        return conn

    def _release(self, conn: _Connection) -> None:
        if conn.loop is self._loop:
            if conn.reusable and len(self._idle) < _MAX_IDLE:
                self._idle.append(conn)
            else:
                conn.close()
                self._open -= 1
            self._slots.release()
        else:
            conn.close()

    @staticmethod
    async def _check(conn: _Connection) -> None:
        status = await conn.headers()
        if status == 200:
            return
        text = (await conn.body()).decode(errors="replace")[:300]
        if status == 401:
            raise WorkerUnavailable(
                "401: the worker requires a cluster token and refused ours (set the same "
                f"--cluster-token on the router and the worker): {text}"
            )
        raise WorkerUnavailable(f"HTTP {status}: {text}")

    async def call(self, method: str, payload: bytes, timeout_s: float) -> bytes:
        conn = await self._acquire()
        try:
            conn.send(self._request(method, payload))
            await asyncio.wait_for(self._check(conn), timeout_s)
            return await asyncio.wait_for(conn.body(), timeout_s)
        except asyncio.TimeoutError:
            conn.close()
            raise self._down(f"{method} timed out after {timeout_s} s") from None
        except WorkerUnavailable as e:
            conn.close()
            raise self._down(f"{method}: {e.message}") from None
        except BaseException:
            conn.close()
            raise
        finally:
            self._release(conn)

    async def stream(self, method: str, payload: bytes) -> AsyncIterator[bytes]:
        """The response's frames. A reader that stops after the last frame leaves the
        connection reusable (the worker sends its end with the last frame); one that stops
        earlier closes it, and the worker aborts the request."""
        conn = await self._acquire()
        timer = conn.loop.call_later(
            self.stream_timeout_s, conn.fail, f"no end after {self.stream_timeout_s} s"
        )
        try:
            conn.send(self._request(method, payload))
            await self._check(conn)
            conn.start_frames()
            while (data := await conn.next_frame()) is not None:
                yield data
        except WorkerUnavailable as e:
            conn.close()
            raise self._down(f"{method}: {e.message}") from None
        finally:
            timer.cancel()
            if not conn.done or conn.frames:
                conn.close()
            self._release(conn)

    async def close(self) -> None:
        """Closes the idle connections; the worker process keeps running (it is not ours)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
