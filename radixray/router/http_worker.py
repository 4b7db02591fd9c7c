"""``HttpWorkerClient``: the ``WorkerClient`` protocol over HTTP to a ``radixray worker`` process.

The worker serves ``/internal/*`` (see ``routes_sglang.py``): ``generate`` posts token ids (a
msgpack body with the ids packed as little-endian int32: JSON for 2k ids cost ~0.4 ms a request
to write, parse and check) and reads NDJSON chunk dicts as they are produced; ``poll`` returns
one msgpack body with the load and the KV events, exactly what ``WorkerHost.poll`` returns
in-process. So a router can front the same worker processes that another router (SGLang's)
fronts, and index them from their own events.

Transport failures (refused, reset, timeout, a 5xx) raise ``WorkerUnavailable``; a 4xx means the
request was bad and becomes an error chunk, never a retry elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import AsyncIterator, Sequence

import aiohttp
import msgpack

from .worker_client import WorkerUnavailable

__all__ = ["HttpWorkerClient", "MSGPACK", "pack_ids", "unpack_ids"]

MSGPACK = "application/x-msgpack"

# aiohttp (a dependency of ray[serve]) rather than httpx on this hop: its C HTTP parser took
# ~3-4 ms less per streamed request than httpx on 2 shared cores, and this hop is the router's
# whole added latency.
_TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)


def pack_ids(ids: Sequence[int]) -> bytes:
    """Token ids as little-endian int32 (ValueError outside the int32 range)."""
    try:
        return struct.pack(f"<{len(ids)}i", *ids)
    except struct.error as e:
        raise ValueError(f"token ids must be int32: {e}") from None


def unpack_ids(data: bytes) -> list[int]:
    """Inverse of :func:`pack_ids` (ValueError if ``data`` is not whole int32s)."""
    if len(data) % 4:
        raise ValueError(f"packed token ids must be a multiple of 4 bytes, got {len(data)}")
    return list(struct.unpack(f"<{len(data) // 4}i", data))


class HttpWorkerClient:
    """One worker at ``base_url``. Build it with :meth:`connect`, which asks the worker its id.
    The HTTP session is created on first use, inside the event loop that will use it."""

    def __init__(
        self,
        base_url: str,
        worker_id: str,
        call_timeout_s: float = 10.0,
        stream_timeout_s: float = 600.0,
        max_connections: int = 512,
    ):
        self.base_url = base_url.rstrip("/")
        self.worker_id = worker_id
        self.call_timeout_s = call_timeout_s
        self.stream_timeout_s = stream_timeout_s
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._packed = True  # token ids as msgpack + int32 (False: the worker only takes JSON)

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_connections),
                timeout=aiohttp.ClientTimeout(
                    total=self.stream_timeout_s, sock_connect=self.call_timeout_s
                ),
            )
        return self._session

    @classmethod
    async def connect(
        cls, base_url: str, worker_id: str | None = None, **kwargs
    ) -> HttpWorkerClient:
        """A client whose ``worker_id`` is the worker's own (unless given)."""
        client = cls(base_url, worker_id or base_url, **kwargs)
        if worker_id is None:
            info = await client.info()
            client.worker_id = str(info.get("worker_id") or base_url)
        return client

    def _down(self, e: BaseException) -> WorkerUnavailable:
        return WorkerUnavailable(
            f"worker {self.worker_id} at {self.base_url}: {type(e).__name__}: {e}"
        )

    async def _get(self, path: str, params: dict | None = None) -> bytes:
        timeout = aiohttp.ClientTimeout(total=self.call_timeout_s)
        try:
            async with self.session.get(self.base_url + path, params=params, timeout=timeout) as r:
                body = await r.read()
        except _TRANSPORT_ERRORS as e:
            raise self._down(e) from e
        if r.status >= 500:
            raise self._down(RuntimeError(f"HTTP {r.status} from {path}: {body[:200]!r}"))
        if r.status >= 400:
            raise RuntimeError(
                f"worker {self.worker_id}: HTTP {r.status} from {path}: {body[:200]!r}"
            )
        return body

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: dict,
        request_id: str,
        extra_key: str | None = None,
    ) -> AsyncIterator[dict]:
        fields = {"params": _jsonable(params), "request_id": request_id, "extra_key": extra_key}
        url = self.base_url + "/internal/generate"
        packed = self._packed
        try:
            while True:
                if packed:
                    body = msgpack.packb(fields | {"prompt_ids": pack_ids(prompt_ids)})
                    kwargs = {"data": body, "headers": {"content-type": MSGPACK}}
                else:
                    kwargs = {"json": fields | {"prompt_ids": list(prompt_ids)}}
                async with self.session.post(url, **kwargs) as r:
                    if r.status >= 500:
                        text = (await r.read()).decode(errors="replace")[:200]
                        raise self._down(RuntimeError(f"HTTP {r.status}: {text}"))
                    if r.status >= 400:
                        raw = await r.read()
                        if packed and b"body must be JSON" in raw:
                            # A worker from before the msgpack hop: speak JSON to it from now on.
                            packed = self._packed = False
                            continue
                        text = raw.decode(errors="replace")[:500]
                        yield {"finish_reason": "error", "error": f"HTTP {r.status}: {text}"}
                        return
                    async for line in r.content:
                        if line.strip():
                            yield json.loads(line)
                    return
        except _TRANSPORT_ERRORS as e:
            raise self._down(e) from e

    async def abort(self, request_id: str) -> None:
        timeout = aiohttp.ClientTimeout(total=self.call_timeout_s)
        try:
            url = f"{self.base_url}/internal/abort/{request_id}"
            async with self.session.post(url, timeout=timeout) as r:
                await r.read()
        except _TRANSPORT_ERRORS as e:
            raise self._down(e) from e

    async def poll(self, since_seq: int, epoch: str | None) -> dict:
        params = {"since_seq": str(since_seq)}
        if epoch is not None:
            params["epoch"] = epoch
        return msgpack.unpackb(await self._get("/internal/poll", params), raw=False)

    async def health(self) -> dict:
        return json.loads(await self._get("/internal/health"))

    async def info(self) -> dict:
        return json.loads(await self._get("/internal/info"))

    async def close(self) -> None:
        """Closes the connections; the worker process keeps running (it is not ours)."""
        if self._session is not None:
            await self._session.close()


def _jsonable(params: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in params.items()}
