"""The gRPC server beside a worker's HTTP one: its own thread and event loop, the same engine
(the engine loop streams to any number of event loops)."""

from __future__ import annotations

import asyncio
import sys
import threading

import grpc

from .kv_relay import KvEventRelay
from .service import SglangScheduler, bind

__all__ = ["GrpcServer", "start_beside_http", "MAX_MESSAGE_BYTES"]

# A long prompt's Generate (a million token ids are a few MB of varints) and a snapshot chunk
# fit; gRPC's default is 4 MiB.
MAX_MESSAGE_BYTES = 64 << 20
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class GrpcServer:
    """``SglangScheduler`` for ``host`` (a ``WorkerHost``) serving ``meta`` (``ModelMeta``) on
    ``address`` (``host:port``; port 0: any free one, see ``port`` once started)."""

    def __init__(self, host, meta, address: str, grace_s: float = 2.0):
        self.host = host
        self.meta = meta
        self.address = address
        self.grace_s = grace_s
        self.port: int | None = None
        self.relay: KvEventRelay | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def start(self, timeout_s: float = 30.0) -> int:
        """Start serving; the port it listens on. Raises if it cannot (the port is taken)."""
        self._thread = threading.Thread(target=self._run, name="grpc-sglang", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError(f"the gRPC server on {self.address} did not start")
        if self._error is not None:
            raise RuntimeError(f"cannot serve gRPC on {self.address}: {self._error}")
        assert self.port is not None
        return self.port

    def stop(self, timeout_s: float = 10.0) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as e:  # reported by start() if it happens before the server is up
            self._error = e
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self.relay = KvEventRelay(self.host)
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ]
        )
        server.add_generic_rpc_handlers((bind(SglangScheduler(self.host, self.meta, self.relay)),))
        port = server.add_insecure_port(self.address)  # 0 (older gRPC) or raises: not bound
        if not port:
            raise OSError(f"could not bind {self.address}")
        await server.start()
        self.relay.start()
        self.port = port
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await self.relay.stop()
            await server.stop(self.grace_s)


def start_beside_http(host, meta, bind_host: str, port: int) -> GrpcServer | None:
    """``radixray worker --grpc-port``: the service on ``bind_host:port``, started; None when it
    cannot listen (said why on stderr)."""
    address = f"[{bind_host}]:{port}" if ":" in bind_host else f"{bind_host}:{port}"
    server = GrpcServer(host, meta, address)
    try:
        bound = server.start()
    except (RuntimeError, TimeoutError) as e:
        print(f"radixray worker: {e}", file=sys.stderr, flush=True)
        return None
    if bind_host not in _LOOPBACK:
        print(
            f"radixray worker: the gRPC port {bound} has no authentication: keep it on a "
            "network only the gateway reaches",
            file=sys.stderr,
            flush=True,
        )
    print(f"radixray worker: SGLang's gRPC scheduler service on grpc://{address}", flush=True)
    return server
