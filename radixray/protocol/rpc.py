"""The worker protocol's calls, one table for every transport.

A call is ``(method name, encoded request) -> encoded reply`` (or a stream of encoded replies
for ``generate``). A transport only moves bytes: in process, over Ray, over Ray Serve or over
HTTP, the worker side answers with :func:`serve_call` / :func:`serve_stream` and the router side
asks through :class:`WorkerClient`. Adding a method is one row in ``METHODS`` plus the worker's
handler and the client's one-line wrapper; no transport changes.

Errors: a handler raises a :class:`RequestError`; it crosses as an ``ErrorInfo`` frame and the
client raises the same kind again. A bug in the worker (any other exception) is reported as an
engine failure, the worker's fault. A transport raises ``WorkerUnavailable`` for its own failures
(refused, reset, timed out, actor died), and a reply that does not decode means a broken worker:
``WorkerUnavailable`` too.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any, NamedTuple, Protocol

from .codec import ProtocolError, decode, encode
from .errors import EngineFailure, InvalidRequest, RequestError, WorkerUnavailable
from .messages import (
    AbortRequest,
    Ack,
    Empty,
    ErrorInfo,
    GenerateRequest,
    Health,
    PollRequest,
    PollResult,
    StreamChunk,
    WorkerInfo,
)

__all__ = [
    "Method",
    "METHODS",
    "Transport",
    "WorkerClient",
    "WorkerHandler",
    "serve_call",
    "serve_frames",
    "serve_stream",
]

log = logging.getLogger(__name__)


class Method(NamedTuple):
    name: str
    request: type
    reply: type
    stream: bool = False


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("generate", GenerateRequest, StreamChunk, stream=True),
        Method("abort", AbortRequest, Ack),
        Method("poll", PollRequest, PollResult),
        Method("info", Empty, WorkerInfo),
        Method("health", Empty, Health),
    )
}
_REPLY = {m.name: m.reply | ErrorInfo for m in METHODS.values()}
_EMPTY = encode(Empty())


class WorkerHandler(Protocol):
    """The worker side: one coroutine per method, typed request in, typed reply out."""

    def generate(self, req: GenerateRequest) -> AsyncIterator[StreamChunk]: ...

    async def abort(self, req: AbortRequest) -> Ack: ...

    async def poll(self, req: PollRequest) -> PollResult: ...

    async def info(self, req: Empty) -> WorkerInfo: ...

    async def health(self, req: Empty) -> Health: ...


def _method(name: str, stream: bool) -> Method:
    m = METHODS.get(name)
    if m is None or m.stream != stream:
        kind = "streaming" if stream else "unary"
        valid = sorted(n for n, x in METHODS.items() if x.stream == stream)
        raise InvalidRequest(f"no {kind} method {name!r}; expected one of {valid}", "method")
    return m


def _unexpected(name: str, e: Exception) -> ErrorInfo:
    log.exception("worker method %s failed", name)
    return ErrorInfo.of(EngineFailure(f"worker error in {name}: {type(e).__name__}: {e}"))


async def serve_call(handler: WorkerHandler, name: str, payload: bytes) -> bytes:
    """Answer one unary call; every failure is an encoded ``ErrorInfo``, never an exception."""
    try:
        m = _method(name, stream=False)
        return encode(await getattr(handler, name)(decode(payload, m.request)))
    except ProtocolError as e:
        reply = ErrorInfo.of(InvalidRequest(str(e)))
    except RequestError as e:
        reply = ErrorInfo.of(e)
    except Exception as e:  # a bug in the handler, or a reply that cannot be encoded
        reply = _unexpected(name, e)
    return encode(reply)


async def serve_frames(
    handler: WorkerHandler, name: str, payload: bytes
) -> AsyncIterator[tuple[bytes, bool]]:
    """Answer one streaming call: ``(encoded chunk, last)`` pairs, ending with a final chunk or
    an ``ErrorInfo`` (``last`` set), so a transport can send the last frame together with the
    end of its response. Closing the iterator early closes the handler's stream (which aborts
    the request)."""
    try:
        m = _method(name, stream=True)
        stream = getattr(handler, name)(decode(payload, m.request))
    except ProtocolError as e:
        yield encode(ErrorInfo.of(InvalidRequest(str(e)))), True
        return
    except RequestError as e:
        yield encode(ErrorInfo.of(e)), True
        return
    except Exception as e:
        yield encode(_unexpected(name, e)), True
        return
    try:
        async for chunk in stream:
            yield encode(chunk), chunk.final
    except RequestError as e:
        yield encode(ErrorInfo.of(e)), True
    except Exception as e:  # a bug in the handler, or a chunk that cannot be encoded
        yield encode(_unexpected(name, e)), True
    finally:
        await stream.aclose()


async def serve_stream(handler: WorkerHandler, name: str, payload: bytes) -> AsyncIterator[bytes]:
    """Answer one streaming call: encoded chunks, ending with a final chunk or an
    ``ErrorInfo``. Closing the iterator early closes the handler's stream (which aborts the
    request)."""
    frames = serve_frames(handler, name, payload)
    try:
        async for data, _ in frames:
            yield data
    finally:
        await frames.aclose()


class Transport(Protocol):
    """Moves encoded calls to one worker. Raises ``WorkerUnavailable`` for its own failures."""

    address: str

    async def call(self, method: str, payload: bytes, timeout_s: float) -> bytes: ...

    def stream(self, method: str, payload: bytes) -> AsyncIterator[bytes]: ...

    async def close(self) -> None: ...


class WorkerClient:
    """The router's handle on one worker, over any transport.

    ``worker_id`` is the worker's own id (from ``info``) unless given; ``connect`` asks for it.
    """

    def __init__(
        self,
        transport: Transport,
        worker_id: str | None = None,
        call_timeout_s: float = 10.0,
        ready_timeout_s: float = 600.0,
    ):
        self.transport = transport
        self.worker_id = worker_id or transport.address
        self.call_timeout_s = call_timeout_s
        self.ready_timeout_s = ready_timeout_s

    @property
    def address(self) -> str:
        return self.transport.address

    @classmethod
    async def connect(cls, transport: Transport, **kwargs: Any) -> WorkerClient:
        """A client named by the worker itself (``info().worker_id``)."""
        client = cls(transport, **kwargs)
        client.worker_id = (await client.info()).worker_id
        return client

    def _reply(self, name: str, data: bytes) -> Any:
        try:
            reply = decode(data, _REPLY[name])
        except ProtocolError as e:
            raise WorkerUnavailable(
                f"worker {self.worker_id} at {self.address} sent an invalid {name} reply: {e}"
            ) from None
        if isinstance(reply, ErrorInfo):
            raise reply.exception()
        return reply

    async def _call(self, name: str, payload: bytes, timeout_s: float | None = None) -> Any:
        data = await self.transport.call(name, payload, timeout_s or self.call_timeout_s)
        return self._reply(name, data)

    async def generate(self, req: GenerateRequest) -> AsyncIterator[StreamChunk]:
        """The request's chunks; ends after the final one. A failure raises its
        ``RequestError``; leaving early closes the stream (the worker aborts the request)."""
        stream = self.transport.stream("generate", encode(req))
        try:
            async for data in stream:
                chunk = self._reply("generate", data)
                yield chunk
                if chunk.final:
                    return
            raise WorkerUnavailable(
                f"worker {self.worker_id} ended request {req.request_id}'s stream early"
            )
        finally:
            await stream.aclose()

    async def abort(self, request_id: str) -> None:
        await self._call("abort", encode(AbortRequest(request_id)))

    async def poll(
        self, since_seq: int = -1, epoch: str | None = None, router_id: str | None = None
    ) -> PollResult:
        return await self._call("poll", encode(PollRequest(since_seq, epoch, router_id)))

    async def info(self) -> WorkerInfo:
        # The first call may wait for the worker to load its model: allow for a slow disk.
        return await self._call("info", _EMPTY, self.ready_timeout_s)

    async def health(self) -> Health:
        return await self._call("health", _EMPTY)

    async def close(self) -> None:
        await self.transport.close()
