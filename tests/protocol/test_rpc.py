"""The rpc layer of the worker protocol over the in-process transport: the method table, typed
replies, one error channel (a handler's RequestError comes back as the same class, a bug as an
engine failure, a broken reply as an unavailable worker) and stream lifetimes.

The handler is a fake on purpose: this is about the rpc layer, not the engine."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator

import msgspec
import numpy as np
import pytest

from radixray.protocol import (
    METHODS,
    PROTOCOL_VERSION,
    Aborted,
    AbortRequest,
    Ack,
    Empty,
    EngineFailure,
    ErrorInfo,
    ErrorKind,
    GenerateRequest,
    Health,
    InvalidRequest,
    LoadReport,
    LocalTransport,
    Method,
    Overloaded,
    PollRequest,
    PollResult,
    RequestError,
    SamplingParams,
    StreamChunk,
    WorkerClient,
    WorkerCounters,
    WorkerInfo,
    WorkerUnavailable,
    decode,
    encode,
    serve_call,
    serve_stream,
)

ERROR_CLASSES = (InvalidRequest, EngineFailure, WorkerUnavailable, Overloaded, Aborted)
UNARY = ("abort", "poll", "info", "health")
REQ = GenerateRequest("req-1", [1, 2, 3], SamplingParams(max_tokens=3))
CHUNKS = [
    StreamChunk([10], "a", cached_tokens=2),
    StreamChunk([11], "b", cached_tokens=2),
    StreamChunk([12], "c", 2, "length", 3, 3, {"cached": 2, "page_tail": 1}),
]
INFO = WorkerInfo("fake-0", "epoch-1", "m", 16, 2048, 32000, "radix", 64, "cpu", "cpu", "local")
HEALTH = Health(True, "fake-0", 1.5)


def _poll_result(req: PollRequest) -> PollResult:
    return PollResult(
        "fake-0",
        req.epoch or "epoch-1",
        req.since_seq + 1,
        req.epoch is None,
        b"\x95\x01",
        True,
        LoadReport(running=1, free_pages=60, total_pages=64),
        WorkerCounters(requests_finished=4, miss_tokens={"cold": 3}),
    )


class FakeWorker:
    """Answers every method with real protocol messages; records what it was asked.

    ``raises``: every method raises it (``generate`` after ``raise_after`` chunks)."""

    def __init__(
        self,
        chunks: list[StreamChunk] = CHUNKS,
        raises: BaseException | None = None,
        raise_after: int = 0,
    ):
        self.chunks = list(chunks)
        self.raises = raises
        self.raise_after = raise_after
        self.calls: list[tuple[str, object]] = []
        self.sent = 0  # chunks handed to serve_stream
        self.stream_closed = False
        self.shut_down = False

    def _call(self, name: str, req: object) -> None:
        self.calls.append((name, req))
        if self.raises is not None:
            raise self.raises

    async def generate(self, req: GenerateRequest) -> AsyncIterator[StreamChunk]:
        self.calls.append(("generate", req))
        try:
            for i, chunk in enumerate(self.chunks):
                if self.raises is not None and i == self.raise_after:
                    raise self.raises
                self.sent += 1
                yield chunk
            if self.raises is not None:
                raise self.raises
        finally:
            self.stream_closed = True

    async def abort(self, req: AbortRequest) -> Ack:
        self._call("abort", req)
        return Ack()

    async def poll(self, req: PollRequest) -> PollResult:
        self._call("poll", req)
        return _poll_result(req)

    async def info(self, req: Empty) -> WorkerInfo:
        self._call("info", req)
        return INFO

    async def health(self, req: Empty) -> Health:
        self._call("health", req)
        return HEALTH

    def shutdown(self) -> None:
        self.shut_down = True


class BytesTransport:
    """A transport whose worker answers every call, and every stream frame, with ``data``."""

    address = "10.0.0.9:8001"

    def __init__(self, *frames: bytes):
        self.frames = frames

    async def call(self, method: str, payload: bytes, timeout_s: float) -> bytes:
        return self.frames[0]

    async def stream(self, method: str, payload: bytes) -> AsyncIterator[bytes]:
        for frame in self.frames:
            yield frame

    async def close(self) -> None:
        pass


def _client(handler, **kwargs) -> WorkerClient:
    return WorkerClient(LocalTransport(handler), **kwargs)


async def _unary(client: WorkerClient, name: str):
    if name == "abort":
        return await client.abort("req-1")
    if name == "poll":
        return await client.poll(3, "epoch-1")
    return await getattr(client, name)()


async def _collect(agen: AsyncIterator[StreamChunk], into: list) -> list:
    async for chunk in agen:
        into.append(chunk)
    return into


# ---------------------------------------------------------------------------- the table


def test_the_method_table():
    assert METHODS == {
        "generate": Method("generate", GenerateRequest, StreamChunk, stream=True),
        "abort": Method("abort", AbortRequest, Ack, stream=False),
        "poll": Method("poll", PollRequest, PollResult, stream=False),
        "info": Method("info", Empty, WorkerInfo, stream=False),
        "health": Method("health", Empty, Health, stream=False),
    }


# ---------------------------------------------------------------------------- replies


def test_unary_methods_return_typed_replies():
    async def main():
        worker = FakeWorker()
        client = _client(worker, worker_id="w")
        assert await client.abort("req-9") is None
        result = await client.poll(3, "epoch-1")
        assert type(result) is PollResult
        assert result == _poll_result(PollRequest(3, "epoch-1"))
        assert await client.poll() == _poll_result(PollRequest())
        info = await client.info()
        assert type(info) is WorkerInfo
        assert info == INFO
        health = await client.health()
        assert type(health) is Health
        assert health == HEALTH
        # Each request reached the handler typed, as sent.
        assert worker.calls == [
            ("abort", AbortRequest("req-9")),
            ("poll", PollRequest(3, "epoch-1")),
            ("poll", PollRequest(-1, None)),
            ("info", Empty()),
            ("health", Empty()),
        ]
        # Through bytes: equal, not the handler's own objects.
        assert info is not INFO

    asyncio.run(main())


def test_connect_names_the_client_after_the_worker():
    async def main():
        client = await WorkerClient.connect(LocalTransport(FakeWorker(), address="here"))
        assert (client.worker_id, client.address) == ("fake-0", "here")
        assert WorkerClient(LocalTransport(FakeWorker(), address="there")).worker_id == "there"

    asyncio.run(main())


def test_generate_yields_chunks_and_stops_after_the_final_one():
    extra = StreamChunk([99], "never sent")
    worker = FakeWorker(chunks=[*CHUNKS, extra])

    async def main():
        got = await _collect(_client(worker).generate(REQ), [])
        # Closed by the client on its way out, not by asyncio.run's shutdown_asyncgens().
        assert worker.stream_closed
        return got

    got = asyncio.run(main())
    assert got == CHUNKS
    assert [type(c) for c in got] == [StreamChunk] * 3
    assert [c.final for c in got] == [False, False, True]
    assert worker.calls == [("generate", REQ)]
    assert worker.sent == 3  # the chunk after the final one was never asked for


def test_generate_of_a_single_final_chunk():
    worker = FakeWorker(chunks=[CHUNKS[-1]])

    async def main():
        assert await _collect(_client(worker).generate(REQ), []) == [CHUNKS[-1]]
        assert worker.stream_closed

    asyncio.run(main())


# ---------------------------------------------------------------------------- errors


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", UNARY)
def test_a_request_error_reaches_the_client_as_the_same_class(cls, name):
    original = cls(f"{name} refused: try later", "since_seq")
    client = _client(FakeWorker(raises=original))
    with pytest.raises(RequestError) as info:
        asyncio.run(_unary(client, name))
    err = info.value
    assert type(err) is cls
    assert err is not original  # it crossed as bytes
    assert (err.message, err.param, err.kind) == (
        f"{name} refused: try later",
        "since_seq",
        cls.kind,
    )


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("after", [0, 1, 2])
def test_a_request_error_in_generate_reaches_the_client(cls, after):
    worker = FakeWorker(raises=cls("engine said no", "prompt"), raise_after=after)
    got: list[StreamChunk] = []
    with pytest.raises(RequestError) as info:
        asyncio.run(_collect(_client(worker).generate(REQ), got))
    assert type(info.value) is cls
    assert (info.value.message, info.value.param) == ("engine said no", "prompt")
    assert got == CHUNKS[:after]
    assert worker.stream_closed


def test_a_request_error_after_the_last_non_final_chunk():
    worker = FakeWorker(chunks=CHUNKS[:2], raises=Overloaded("queue full"), raise_after=2)
    got: list[StreamChunk] = []
    with pytest.raises(Overloaded, match="^queue full$"):
        asyncio.run(_collect(_client(worker).generate(REQ), got))
    assert got == CHUNKS[:2]


@pytest.mark.parametrize("name", UNARY)
def test_a_bug_in_a_unary_handler_is_an_engine_failure(name, caplog):
    client = _client(FakeWorker(raises=RuntimeError("list index out of range")))
    with caplog.at_level(logging.ERROR, logger="radixray.protocol.rpc"):
        with pytest.raises(RequestError) as info:
            asyncio.run(_unary(client, name))
    assert type(info.value) is EngineFailure
    assert info.value.message == f"worker error in {name}: RuntimeError: list index out of range"
    assert info.value.param is None
    assert [r.getMessage() for r in caplog.records] == [f"worker method {name} failed"]


@pytest.mark.parametrize("after", [0, 2])
@pytest.mark.parametrize(
    "exc, message",
    [
        (RuntimeError("boom"), "worker error in generate: RuntimeError: boom"),
        (KeyError("page 7"), "worker error in generate: KeyError: 'page 7'"),
    ],
)
def test_a_bug_in_generate_is_an_engine_failure(after, exc, message):
    worker = FakeWorker(raises=exc, raise_after=after)
    got: list[StreamChunk] = []
    with pytest.raises(RequestError) as info:
        asyncio.run(_collect(_client(worker).generate(REQ), got))
    assert type(info.value) is EngineFailure
    assert info.value.message == message
    assert info.value.param is None
    assert got == CHUNKS[:after]
    assert worker.stream_closed


# ---------------------------------------------------------------------------- broken workers


@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("data", [b"", b"\xc1\xc1", b"\x93\x01\x02", b"not msgpack at all"])
def test_garbage_from_the_transport_is_an_unavailable_worker(name, data):
    client = WorkerClient(BytesTransport(data), worker_id="w-7")
    with pytest.raises(RequestError) as info:
        asyncio.run(_unary(client, name))
    assert type(info.value) is WorkerUnavailable
    reply = METHODS[name].reply.__struct_config__.tag.split("/")[0]
    assert info.value.message.startswith(
        f"worker w-7 at 10.0.0.9:8001 sent an invalid {name} reply: "
    )
    assert f"{reply} or error message" in info.value.message


def test_garbage_in_a_stream_is_an_unavailable_worker():
    transport = BytesTransport(encode(CHUNKS[0]), b"\xc1garbage")
    got: list[StreamChunk] = []
    with pytest.raises(WorkerUnavailable) as info:
        asyncio.run(_collect(WorkerClient(transport, worker_id="w-7").generate(REQ), got))
    assert got == [CHUNKS[0]]
    assert "sent an invalid generate reply" in info.value.message
    assert "invalid" in str(info.value)


def test_a_reply_of_the_wrong_type_is_an_unavailable_worker():
    client = WorkerClient(BytesTransport(encode(Ack())), worker_id="w-7")
    with pytest.raises(WorkerUnavailable) as info:
        asyncio.run(client.poll())
    assert info.value.message == (
        "worker w-7 at 10.0.0.9:8001 sent an invalid poll reply: "
        f"expected a poll_result or error message, got 'ack/{PROTOCOL_VERSION}'"
    )


def test_a_reply_from_another_protocol_version_is_an_unavailable_worker():
    raw = msgspec.msgpack.decode(encode(HEALTH))
    raw[0] = "health/99"
    client = WorkerClient(BytesTransport(msgspec.msgpack.encode(raw)), worker_id="w-7")
    with pytest.raises(WorkerUnavailable, match="health message of protocol version 99"):
        asyncio.run(client.health())


@pytest.mark.parametrize("chunks", [[], CHUNKS[:1], CHUNKS[:2]], ids=["none", "one", "two"])
def test_a_stream_without_a_final_chunk_is_an_unavailable_worker(chunks):
    worker = FakeWorker(chunks=chunks)
    got: list[StreamChunk] = []
    with pytest.raises(RequestError) as info:
        asyncio.run(_collect(_client(worker, worker_id="w-3").generate(REQ), got))
    assert type(info.value) is WorkerUnavailable
    assert info.value.message == "worker w-3 ended request req-1's stream early"
    assert got == chunks


def test_a_call_that_never_answers_times_out_as_an_unavailable_worker():
    class Stuck(FakeWorker):
        async def health(self, req: Empty) -> Health:
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

    client = _client(Stuck(), call_timeout_s=0.01)
    with pytest.raises(WorkerUnavailable) as info:
        asyncio.run(client.health())
    assert info.value.message == "local worker: health timed out after 0.01s"


# ---------------------------------------------------------------------------- serve_*


def test_serve_call_refuses_an_unknown_method():
    worker = FakeWorker()
    for name in ("nope", "generate", ""):
        reply = asyncio.run(serve_call(worker, name, encode(Empty())))
        assert decode(reply, ErrorInfo) == ErrorInfo(
            ErrorKind.INVALID_REQUEST,
            f"no unary method {name!r}; expected one of ['abort', 'health', 'info', 'poll']",
            "method",
        )
    assert worker.calls == []


def test_serve_stream_refuses_a_unary_method():
    async def main(name: str) -> list[bytes]:
        return [frame async for frame in serve_stream(worker, name, encode(Empty()))]

    worker = FakeWorker()
    for name in ("poll", "health", "nope"):
        frames = asyncio.run(main(name))
        assert len(frames) == 1
        assert decode(frames[0], ErrorInfo) == ErrorInfo(
            ErrorKind.INVALID_REQUEST,
            f"no streaming method {name!r}; expected one of ['generate']",
            "method",
        )
    assert worker.calls == []


def test_serve_call_refuses_a_bad_request_as_invalid():
    worker = FakeWorker()
    reply = decode(asyncio.run(serve_call(worker, "abort", encode(Empty()))), ErrorInfo)
    assert reply == ErrorInfo(
        ErrorKind.INVALID_REQUEST,
        f"expected an abort message, got 'empty/{PROTOCOL_VERSION}'",
        None,
    )
    reply = decode(asyncio.run(serve_call(worker, "poll", b"\xc1")), ErrorInfo)
    assert reply.kind is ErrorKind.INVALID_REQUEST
    assert reply.message.startswith("expected a msgpack poll message: ")
    assert worker.calls == []


def test_serve_stream_refuses_a_bad_request_as_invalid():
    async def main(payload: bytes) -> list[bytes]:
        return [frame async for frame in serve_stream(worker, "generate", payload)]

    worker = FakeWorker()
    bad = msgspec.msgpack.decode(encode(REQ))
    bad[2] = [1, -1]
    frames = asyncio.run(main(msgspec.msgpack.encode(bad)))
    assert [decode(f, ErrorInfo) for f in frames] == [
        ErrorInfo(
            ErrorKind.INVALID_REQUEST,
            "invalid generate message: Expected `int` >= 0 - at `$[2][1]` (prompt_ids[1])",
            None,
        )
    ]
    assert worker.calls == []


def test_the_client_surfaces_an_invalid_request_from_the_worker():
    """A request the worker cannot decode (here: a bad token id) comes back as InvalidRequest."""
    bad = msgspec.structs.replace(REQ, prompt_ids=[2**31])  # no check on construction
    with pytest.raises(InvalidRequest) as info:
        asyncio.run(_collect(_client(FakeWorker()).generate(bad), []))
    assert (info.value.message, info.value.param) == (
        "invalid generate message: Expected `int` <= 2147483647 - at `$[2][0]` (prompt_ids[0])",
        None,
    )


# ---------------------------------------------------------------------------- lifetimes


def test_closing_generate_early_closes_the_handler_stream():
    worker = FakeWorker()

    async def main():
        stream = _client(worker).generate(REQ)
        first = await stream.__anext__()
        assert first == CHUNKS[0]
        assert not worker.stream_closed
        await stream.aclose()
        # Closed by aclose itself, not later by asyncio.run's shutdown_asyncgens().
        assert worker.stream_closed

    asyncio.run(main())
    assert worker.sent == 1


def test_close_shuts_down_an_owned_worker_only():
    owned, borrowed = FakeWorker(), FakeWorker()
    asyncio.run(_client(owned).close())
    asyncio.run(WorkerClient(LocalTransport(borrowed, owner=False)).close())
    assert (owned.shut_down, borrowed.shut_down) == (True, False)


# ---------------------------------------------------------------------------- failures at the edges


def test_an_unencodable_reply_is_an_engine_failure(caplog):
    class NumpyLoad(FakeWorker):
        async def poll(self, req: PollRequest) -> PollResult:
            result = _poll_result(req)
            load = msgspec.structs.replace(result.load, free_pages=np.int64(60))
            return msgspec.structs.replace(result, load=load)

    with caplog.at_level(logging.ERROR, logger="radixray.protocol.rpc"):
        reply = asyncio.run(serve_call(NumpyLoad(), "poll", encode(PollRequest())))
    assert decode(reply, ErrorInfo) == ErrorInfo(
        ErrorKind.ENGINE_FAILURE,
        "worker error in poll: TypeError: Encoding objects of type numpy.int64 is unsupported",
        None,
    )
    assert [r.getMessage() for r in caplog.records] == ["worker method poll failed"]


@pytest.mark.parametrize(
    "exc, expected",
    [
        (
            InvalidRequest("prompt too long", "prompt"),
            ErrorInfo(ErrorKind.INVALID_REQUEST, "prompt too long", "prompt"),
        ),
        (
            RuntimeError("boom"),
            ErrorInfo(ErrorKind.ENGINE_FAILURE, "worker error in generate: RuntimeError: boom"),
        ),
    ],
    ids=["request-error", "bug"],
)
def test_an_eager_generate_error_is_an_error_frame(exc, expected):
    """A generate that checks the request before returning its stream (a plain def): its
    error ends the stream as one ErrorInfo frame, as a lazy one's would."""

    class Eager(FakeWorker):
        def generate(self, req: GenerateRequest) -> AsyncIterator[StreamChunk]:
            self.calls.append(("generate", req))
            raise exc

    async def main() -> list[bytes]:
        return [frame async for frame in serve_stream(worker, "generate", encode(REQ))]

    worker = Eager()
    frames = asyncio.run(main())
    assert [decode(f, ErrorInfo) for f in frames] == [expected]
    assert worker.calls == [("generate", REQ)]


DEEP = b"\x91" * (2 * sys.getrecursionlimit() + 10) + b"\x01"  # [[[...[1]...]]], ~2 KB


def test_deeply_nested_garbage_from_the_transport_is_an_unavailable_worker():
    with pytest.raises(WorkerUnavailable) as info:
        asyncio.run(WorkerClient(BytesTransport(DEEP), worker_id="w-7").health())
    assert info.value.message == (
        "worker w-7 at 10.0.0.9:8001 sent an invalid health reply: invalid health or error "
        "message: Expected `str`, got `array` - at `$[0]`"
    )


def test_deeply_nested_garbage_request_is_invalid():
    worker = FakeWorker()
    info = decode(asyncio.run(serve_call(worker, "poll", DEEP)), ErrorInfo)
    assert info == ErrorInfo(
        ErrorKind.INVALID_REQUEST,
        "invalid poll message: Expected `str`, got `array` - at `$[0]`",
        None,
    )

    async def main() -> list[bytes]:
        return [frame async for frame in serve_stream(worker, "generate", DEEP)]

    assert [decode(f, ErrorInfo) for f in asyncio.run(main())] == [
        ErrorInfo(
            ErrorKind.INVALID_REQUEST,
            "invalid generate message: Expected `array` of at least length 4, got 1",
            None,
        )
    ]
    assert worker.calls == []
