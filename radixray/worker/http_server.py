"""``radixray worker``: one engine over HTTP. A plain ASGI app with three faces:

* ``POST /internal/<method>``: the worker protocol (``radixray.protocol.http_transport``) that
  radixray's router speaks (``radixray serve --worker-urls``). Behind the cluster token when
  one is set (``--cluster-token``; always, when the worker listens beyond loopback): without
  it, 401. Aborting a request is only possible here, so nobody without the token can abort
  someone else's request.
* What SGLang's router probes (``sglang_compat.py``: ``/health``, ``/server_info``, ``/get_load``,
  ...) and ``/debug/cache`` (the engine's counters, read by the live benchmark).
* The OpenAI API (``/v1/*``, ``radixray.api``) served from this engine alone, for clients and
  for routers that forward OpenAI requests (SGLang's).

The internal hop is served in plain ASGI: FastAPI's routing and validation layers cost
milliseconds per request on a busy CPU, and this hop is every routed request's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from urllib.parse import parse_qs

from radixray.api import BodyLimit, OpenAIApp, ResponseStore, install_openai
from radixray.api.auth import bearer_matches
from radixray.api.body import BodyTooLarge, read_body
from radixray.api.errors import error_body
from radixray.model_meta import ModelMeta, served_model_name
from radixray.protocol import METHODS, GenerateRequest, StreamChunk
from radixray.protocol.http_transport import FRAMES, INTERNAL_PREFIX, MSGPACK, frame
from radixray.protocol.rpc import serve_frames

from . import sglang_compat
from .host import WorkerHost
from .stats import STEP_FIELDS

__all__ = ["WorkerServer", "EngineBackend"]

_JSON = b"application/json"


class _LocalStream:
    """An OpenAI request served by this worker's engine (``radixray.api.TokenStream``)."""

    def __init__(self, worker_id: str, agen: AsyncIterator[StreamChunk], first: StreamChunk):
        self.worker_id = worker_id
        self.first = first
        self._agen = agen

    @property
    def cached_tokens(self) -> int:
        return self.first.cached_tokens

    async def __aiter__(self) -> AsyncIterator[StreamChunk]:
        yield self.first
        if not self.first.final:
            async for chunk in self._agen:
                yield chunk

    async def aclose(self) -> None:
        await self._agen.aclose()  # before the end: aborts the request


class EngineBackend:
    """The OpenAI edge's backend on a worker: its own engine, no routing."""

    def __init__(self, host: WorkerHost, meta: ModelMeta, max_tokens_limit: int = 4096):
        self.host = host
        self.meta = meta
        self.max_tokens_limit = max_tokens_limit
        self.retry_after_s = 1

    async def open(
        self, req: GenerateRequest, session_key: str | None, cache_key: str | None = None
    ) -> _LocalStream:
        agen = self.host.generate(req)
        try:
            first = await agen.__anext__()
        except BaseException:
            await agen.aclose()
            raise
        return _LocalStream(self.host.worker_id, agen, first)


class WorkerServer:
    def __init__(
        self,
        host: WorkerHost,
        token: str | None = None,
        served_name: str | None = None,
        max_body_bytes: int = 4 << 20,
        max_tokens_limit: int = 4096,
    ):
        """``token``: the cluster token the internal routes require (None: none)."""
        self.host = host
        self.token = token
        self.max_body_bytes = max_body_bytes
        engine = host.engine
        if engine.tokenizer is None:
            raise ValueError("a worker served over HTTP needs a model with a tokenizer")
        self.meta = ModelMeta(
            served_name or served_model_name(engine.config.model),
            engine.tokenizer,
            engine.model_config,
            engine.max_model_len,
        )
        openai = OpenAIApp(title="radixray worker", version="0.1.0")
        # Stored responses (/v1/responses) are this worker's own, their ids named after it.
        install_openai(
            openai, EngineBackend(host, self.meta, max_tokens_limit), ResponseStore(host.worker_id)
        )
        # The last added runs first: SGLang's fields are dropped from bodies within the limit.
        openai.add_middleware(sglang_compat.DropNeutralFields)
        openai.add_middleware(BodyLimit, limit=max_body_bytes)
        self.openai = openai

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            path, method = scope["path"], scope["method"]
            if path.startswith(INTERNAL_PREFIX):
                await self._internal(scope, receive, send, path[len(INTERNAL_PREFIX) :])
                return
            if method == "GET":
                probe = self._probe(path, scope.get("query_string", b""))
                if probe is not None:
                    status, body = probe
                    await _send(send, status, json.dumps(body).encode(), _JSON)
                    return
        await self.openai(scope, receive, send)

    # ------------------------------------------------------------------ probes

    def _probe(self, path: str, query: bytes = b"") -> tuple[int, object] | None:
        """The JSON GET routes, or None when ``path`` is not one of them."""
        if path == "/debug/steps":
            return self._steps(query)
        if path == "/health":
            ok = self.host.engine.alive
            return (200 if ok else 503), {"status": "ok" if ok else "unavailable"}
        if path == "/debug/cache":
            load, counters = self.host.engine.report()
            return 200, sglang_compat.cache_page(self.host.worker_id, load, counters)
        return sglang_compat.probe(path, self, query)

    def _steps(self, query: bytes) -> tuple[int, object]:
        """The engine's step log after the first ``since`` steps (``?since=N``, default 0):
        ``{worker_id, steps, fields, log}``, what ``radixray.sim.calibrate`` fits a timing
        model to, and its engine-side TTFTs after the first ``ttft_since`` (``first_tokens``,
        ``ttft``); ``bench_sim_vs_live.py`` reads both after a live run."""
        args = parse_qs(query.decode("latin-1"))
        seen = {}
        for name in ("since", "ttft_since"):
            raw = args.get(name, ["0"])[-1]
            try:
                seen[name] = int(raw)
            except ValueError:
                seen[name] = -1  # not an int: refused below, as a negative one is
            if seen[name] < 0:
                msg = f"{name} must be an int >= 0, got {raw!r}"
                return 400, error_body(msg, "invalid_request_error", name)
        since, ttft_since = seen["since"], seen["ttft_since"]
        meter = self.host.engine.meter
        # counts read first: an entry that lands meanwhile is in the next read
        steps, firsts = meter.steps, meter.first_tokens
        log = meter.steps_since(since)[: max(steps - since, 0)]
        ttfts = meter.first_tokens_since(ttft_since)[: max(firsts - ttft_since, 0)]
        return 200, {
            "worker_id": self.host.worker_id,
            "steps": steps,
            "fields": list(STEP_FIELDS),
            "log": [list(x) for x in log],
            # (prompt_tokens, cached_tokens, seconds from the engine taking a request to its
            # first token), for requests whose first token came after the first ``ttft_since``
            "first_tokens": firsts,
            "ttft": [list(x) for x in ttfts],
        }

    # ------------------------------------------------------------------ the worker protocol

    async def _internal(self, scope, receive, send, name: str) -> None:
        if self.token is not None:
            auth = dict(scope["headers"]).get(b"authorization")
            if not bearer_matches(auth, self.token):
                msg = "the internal routes need the cluster token (Authorization: Bearer ...)"
                await _send_error(send, 401, msg, "authentication_error", "invalid_token")
                return
        if scope["method"] != "POST":
            await _send_error(send, 405, "internal routes take POST", "invalid_request_error")
            return
        method = METHODS.get(name)
        if method is None:
            valid = ", ".join(sorted(METHODS))
            msg = f"no internal method {name!r}; expected one of {valid}"
            await _send_error(send, 404, msg, "not_found_error")
            return
        payload = await self._read(receive, send)
        if payload is None:
            return
        if not method.stream:
            await _send(send, 200, await self.host.call(name, payload), MSGPACK.encode())
            return
        await self._stream(receive, send, name, payload)

    async def _read(self, receive, send) -> bytes | None:
        """The request's body; None when the caller left, or when it was over the limit (then
        it has been answered 413, naming the limit, once the body was read: ``body.py``)."""
        try:
            return await read_body(receive, self.max_body_bytes)
        except BodyTooLarge as e:
            await _send_error(send, 413, e.message, "invalid_request_error", "too_large")
            return None

    async def _stream(self, receive, send, name: str, payload: bytes) -> None:
        """Frames as the engine produces them, the last one with the end of the response (one
        write: the router reads the end with it and reuses the connection at once); a caller
        that goes away aborts the request."""
        frames = serve_frames(self.host, name, payload)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", FRAMES.encode())],
            }
        )

        async def pump() -> None:
            async for data, last in frames:
                message = {"type": "http.response.body", "body": frame(data), "more_body": not last}
                await send(message)
                if last:
                    return
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        async def caller_left() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        job = asyncio.ensure_future(pump())
        watch = asyncio.ensure_future(caller_left())
        try:
            await asyncio.wait({job, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not job.done():
                job.cancel()
            await asyncio.gather(job, watch, return_exceptions=True)
            # Closing the frames closes the engine's stream: before its end, that aborts the
            # request and frees its pages.
            await frames.aclose()


async def _send(send, status: int, body: bytes, media_type: bytes) -> None:
    headers = [(b"content-type", media_type), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _send_error(send, status: int, message: str, kind: str, code: str | None = None):
    body = json.dumps(error_body(message, kind, None, code)).encode()
    await _send(send, status, body, _JSON)
