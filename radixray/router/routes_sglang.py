"""Worker endpoints other routers need, and the internal API radixray's own router uses over HTTP.

A ``radixray worker`` process is the router app with one in-process worker. Two kinds of callers
front it besides plain OpenAI clients:

* SGLang's Rust router (``sglang-router``) probes ``/health``, ``/server_info`` (or
  ``/get_server_info``), ``/model_info`` (or ``/get_model_info``) and, for ``power_of_two``,
  ``/get_load``, which must be a JSON *list*. It rebuilds OpenAI request bodies and adds its own
  extension fields (``skip_special_tokens: true``, ``ignore_eos: false``, ...). The OpenAI schema
  rejects unknown fields, so :class:`WorkerEdge` drops those fields when they carry the
  value that changes nothing for radixray; any other value still reaches the schema, which
  either honours it (``ignore_eos: true``) or answers 400 naming the field.
* radixray's router in another process (:class:`radixray.router.http_worker.HttpWorkerClient`)
  speaks the ``WorkerClient`` protocol over ``/internal/*``: token ids in, NDJSON chunk dicts
  out, and ``poll`` as one msgpack body (the KV events are already msgpack bytes inside it).

The internal routes need exactly one worker in the app (``radixray worker``); on a router with
several they answer 409.
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import parse_qs

import msgpack
from fastapi import APIRouter, FastAPI

from .errors import ApiError
from .http_worker import MSGPACK, unpack_ids
from .middleware import replay_body
from .openai_api import error_body
from .service import RouterService
from .worker_client import WorkerUnavailable

__all__ = ["sglang_routes", "install_sglang_routes", "WorkerEdge", "SGLANG_NEUTRAL_FIELDS"]

# SGLang router extension fields and the value at which each is a no-op for radixray (plain
# sampling, no reasoning parser, no hidden states, stops trimmed, special tokens skipped).
SGLANG_NEUTRAL_FIELDS: dict[str, object] = {
    "no_stop_trim": False,
    "ignore_eos": False,
    "skip_special_tokens": True,
    "return_hidden_states": False,
    "continue_final_message": False,
    "separate_reasoning": True,
    "stream_reasoning": True,
}
_FILTERED_PATHS = ("/v1/completions", "/v1/chat/completions")
_NDJSON = "application/x-ndjson"
_MSGPACK = "application/msgpack"


def sglang_routes(service: RouterService) -> APIRouter:
    api = APIRouter()
    meta = service.meta

    def the_worker():
        workers = list(service.pool.workers.values())
        if len(workers) != 1:
            raise ApiError(
                409,
                f"internal worker routes need exactly one worker in this app, it has "
                f"{len(workers)} (they are served by `radixray worker`)",
                code="not_a_worker",
            )
        return workers[0]

    def server_info() -> dict:
        entries = list(service.pool.workers.values())
        first = entries[0].info if entries else {}
        return {
            "served_model_name": meta.name,
            "model_path": meta.name,
            "tokenizer_path": None,
            "context_length": meta.max_model_len,
            "page_size": service.settings.page_size,
            "worker_ids": [e.worker_id for e in entries],
            "device": first.get("device"),
            "version": "radixray-0.1.0",
        }

    def model_info() -> dict:
        return {
            "model_path": meta.name,
            "tokenizer_path": None,
            "is_generation": True,
            "context_length": meta.max_model_len,
            "vocab_size": meta.vocab_size,
        }

    @api.get("/server_info")
    async def get_server_info_a():
        return server_info()

    @api.get("/get_server_info")
    async def get_server_info_b():
        return server_info()

    @api.get("/model_info")
    async def get_model_info_a():
        return model_info()

    @api.get("/get_model_info")
    async def get_model_info_b():
        return model_info()

    @api.get("/get_load")
    async def get_load():
        # SGLang's shape: one entry per data-parallel rank; its router sums ``num_tokens``.
        return [
            {
                "dp_rank": i,
                "worker_id": st.worker_id,
                "num_reqs": st.running + st.waiting,
                "num_waiting_reqs": st.waiting,
                "num_tokens": st.queued_prefill_tokens + st.active_decode_tokens,
            }
            for i, st in enumerate(service.pool.states())
        ]

    @api.get("/internal/info")
    async def internal_info():
        entry = the_worker()
        try:
            return await entry.client.info()
        except WorkerUnavailable as e:
            raise ApiError(503, str(e), "service_unavailable", code="worker_down") from None

    @api.get("/internal/health")
    async def internal_health():
        entry = the_worker()
        try:
            return await entry.client.health()
        except WorkerUnavailable as e:
            raise ApiError(503, str(e), "service_unavailable", code="worker_down") from None

    @api.post("/internal/abort/{request_id}")
    async def internal_abort(request_id: str):
        await the_worker().client.abort(request_id)
        return {"request_id": request_id, "status": "aborted"}

    return api


class WorkerEdge:
    """Outermost ASGI middleware of the app.

    * ``POST /internal/generate`` and ``GET /internal/poll`` are served here, in plain ASGI: they
      are the per-request hop between radixray's router and a worker process, and FastAPI's
      routing, validation and ``BaseHTTPMiddleware`` layers cost milliseconds per request on a
      busy CPU (measured: a trivial GET took ~5 ms through them on 2 shared cores). The body size
      limit still applies; they are not counted in the app's per-route request metric.
    * SGLang's extension fields at their neutral values are dropped from OpenAI request bodies
      (see the module docstring).

    Everything else passes through untouched.
    """

    def __init__(self, app, service: RouterService):
        self.app = app
        self.service = service

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            path, method = scope["path"], scope["method"]
            if method == "POST" and path == "/internal/generate":
                await self._generate(scope, receive, send)
                return
            if method == "GET" and path == "/internal/poll":
                await self._poll(scope, send)
                return
            if method == "POST" and path in _FILTERED_PATHS:
                await self._filtered(scope, receive, send)
                return
        await self.app(scope, receive, send)

    # ------------------------------------------------------------------ internal hop

    def _worker(self):
        workers = list(self.service.pool.workers.values())
        if len(workers) != 1:
            raise _Reject(
                409,
                f"internal worker routes need exactly one worker in this app, it has "
                f"{len(workers)} (they are served by `radixray worker`)",
                "not_a_worker",
            )
        return workers[0]

    async def _read(self, receive) -> bytes | None:
        limit = self.service.settings.max_body_bytes
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            body += message.get("body", b"")
            if len(body) > limit:
                raise _Reject(413, f"request body exceeds the {limit}-byte limit", "too_large")
            if not message.get("more_body", False):
                return bytes(body)

    async def _generate(self, scope, receive, send) -> None:
        try:
            raw = await self._read(receive)
            if raw is None:
                return
            content_type = dict(scope.get("headers") or ()).get(b"content-type", b"")
            req = self._parse_generate(raw, content_type.split(b";")[0].strip() == MSGPACK.encode())
            client = self._worker().client
        except _Reject as e:
            await e.send(send)
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", _NDJSON.encode())],
            }
        )
        prompt_ids, params, request_id, extra_key = req

        async def pump() -> bool:
            agen = client.generate(prompt_ids, params, request_id, extra_key)
            try:
                async for chunk in agen:
                    last = bool(chunk.get("finish_reason"))
                    line = json.dumps(chunk, separators=(",", ":")).encode() + b"\n"
                    await send({"type": "http.response.body", "body": line, "more_body": True})
                    if last:
                        return True
            except (ValueError, TypeError) as e:  # bad sampling params: one error chunk
                err = {"finish_reason": "error", "error": f"invalid params: {e}"}
                line = json.dumps(err).encode() + b"\n"
                await send({"type": "http.response.body", "body": line, "more_body": True})
                return True
            finally:
                await agen.aclose()
            return False

        async def disconnected() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        job = asyncio.ensure_future(pump())
        watch = asyncio.ensure_future(disconnected())
        finished = False
        try:
            await asyncio.wait({job, watch}, return_when=asyncio.FIRST_COMPLETED)
            if job.done():
                finished = job.result()
        except OSError:  # the connection broke while sending
            pass
        finally:
            watch.cancel()
            if not job.done():
                job.cancel()
                await asyncio.gather(job, return_exceptions=True)
            if not finished:
                # The router went away (or the stream broke) before the end: free the pages.
                try:
                    await client.abort(request_id)
                except WorkerUnavailable:
                    pass
        if finished:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _parse_generate(self, raw: bytes, packed: bool = False):
        """The body is JSON (``prompt_ids`` a list of ints: for curl and debugging) or, with
        ``content-type: application/x-msgpack`` (what HttpWorkerClient sends), msgpack with
        ``prompt_ids`` as little-endian int32 bytes."""
        try:
            body = msgpack.unpackb(raw, raw=False) if packed else json.loads(raw)
        except ValueError:
            kind = "msgpack" if packed else "JSON"
            raise _Reject(400, f"body must be {kind}", "invalid_json") from None
        if not isinstance(body, dict):
            raise _Reject(400, "body must be an object", "invalid_json")
        if packed and isinstance(body.get("prompt_ids"), bytes):
            try:
                body["prompt_ids"] = unpack_ids(body["prompt_ids"])
            except ValueError as e:
                raise _Reject(400, str(e), "prompt_ids") from None
        unknown = set(body) - {"prompt_ids", "params", "request_id", "extra_key"}
        if unknown:
            raise _Reject(400, f"unknown fields {sorted(unknown)}", "extra_forbidden")
        ids, params = body.get("prompt_ids"), body.get("params")
        rid, extra = body.get("request_id"), body.get("extra_key")
        vocab = self.service.meta.vocab_size
        if not isinstance(ids, list) or not ids:
            raise _Reject(400, "prompt_ids must be a non-empty list of token ids", "prompt_ids")
        if not all(type(t) is int for t in ids) or min(ids) < 0 or max(ids) >= vocab:
            raise _Reject(400, f"prompt_ids must be ints in [0, {vocab})", "prompt_ids")
        if not isinstance(params, dict):
            raise _Reject(400, "params must be an object of sampling parameters", "params")
        if not isinstance(rid, str) or not 0 < len(rid) <= 256:
            raise _Reject(400, "request_id must be a string of 1 to 256 characters", "request_id")
        if extra is not None and not isinstance(extra, str):
            raise _Reject(400, "extra_key must be a string or null", "extra_key")
        return ids, params, rid, extra

    async def _poll(self, scope, send) -> None:
        try:
            query = parse_qs(scope.get("query_string", b"").decode())
            since = query.get("since_seq", ["-1"])[0]
            epoch = query.get("epoch", [None])[0]
            try:
                since_seq = int(since)
            except ValueError:
                raise _Reject(
                    400, f"since_seq must be an int, got {since!r}", "since_seq"
                ) from None
            entry = self._worker()
            try:
                resp = await entry.client.poll(since_seq, epoch)
            except WorkerUnavailable as e:
                raise _Reject(503, str(e), "worker_down") from None
        except _Reject as e:
            await e.send(send)
            return
        await _send_bytes(send, 200, msgpack.packb(resp, use_bin_type=True), _MSGPACK)

    # ------------------------------------------------------------------ SGLang's fields

    async def _filtered(self, scope, receive, send) -> None:
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # disconnect: let the app see it
                await self.app(scope, replay_body(bytes(body), receive), send)
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
        data = bytes(body)
        if any(k.encode() in data for k in SGLANG_NEUTRAL_FIELDS):
            data = _strip_neutral(data)
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-length"]
            headers.append((b"content-length", str(len(data)).encode()))
            scope = dict(scope, headers=headers)
        await self.app(scope, replay_body(data, receive), send)


class _Reject(Exception):
    """An OpenAI-shaped error answer from the ASGI fast path."""

    def __init__(self, status: int, message: str, code: str):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code

    async def send(self, send) -> None:
        kind = "invalid_request_error" if self.status < 500 else "service_unavailable"
        body = json.dumps(error_body(self.message, kind, code=self.code)).encode()
        await _send_bytes(send, self.status, body, "application/json")


async def _send_bytes(send, status: int, body: bytes, media_type: str) -> None:
    headers = [(b"content-type", media_type.encode()), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _strip_neutral(data: bytes) -> bytes:
    try:
        obj = json.loads(data)
    except ValueError:
        return data  # not JSON: the route answers with its own 400
    if not isinstance(obj, dict):
        return data
    for key, neutral in SGLANG_NEUTRAL_FIELDS.items():
        if key in obj and obj[key] == neutral and type(obj[key]) is type(neutral):
            del obj[key]
    return json.dumps(obj).encode()


def install_sglang_routes(app: FastAPI, service: RouterService) -> None:
    """Add the probe and internal routes and the :class:`WorkerEdge` middleware to ``app``."""
    app.include_router(sglang_routes(service))
    app.add_middleware(WorkerEdge, service=service)
