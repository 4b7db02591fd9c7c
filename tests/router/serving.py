"""Test helpers: run the real router app under uvicorn on 127.0.0.1 in a background thread."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Sequence

import uvicorn

from radixray.router.app import build_app
from radixray.router.service import RouterService


class StepGate:
    """Holds an in-process worker's engine between two steps, from the second step after it is
    built until ``release()``: a request whose prefill the first step ran stays running (it
    cannot finish, whatever the machine's speed) for as long as the test needs to look at it.
    While it waits, the engine's thread still answers reads (polls) between the steps; an abort
    lands once released. Build it before the request is sent, with nothing else queued."""

    def __init__(self, host):
        engine = host.engine
        self._loop = engine.loop
        self._engine = engine
        self._step = engine.step
        self._steps = 0
        self._open = threading.Event()
        engine.step = self._gated_step

    def _gated_step(self):
        if not self._engine.has_work():  # a turn that only answered reads: not a step to count
            return self._step()
        if self._steps >= 1:
            deadline = time.monotonic() + 300  # bounded: a broken test must not hang the engine
            while not self._open.wait(timeout=0.01) and time.monotonic() < deadline:
                self._loop.answer_calls()
        self._steps += 1
        return self._step()

    def release(self) -> None:
        self._open.set()


def wait_for(condition: Callable[[], object], what: str, timeout: float = 60) -> float:
    """Poll ``condition`` until it holds; returns the seconds that took. ``timeout`` only
    guards against a hang (it is no performance bound): past it the test fails saying that
    ``what`` never happened."""
    t0 = time.monotonic()
    while not condition():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(0.01)
    return time.monotonic() - t0


def streaming(entry) -> bool:
    """Whether the router has a request on this worker (a pool entry) past its first token."""
    return any(f.started for f in list(entry.inflight.values()))


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def free_ports(n: int) -> int:
    """The first of ``n`` consecutive ports free now (``start_workers`` takes base, base + 1,
    ...): ``free_port`` vouches for one port only."""
    while True:
        base = free_port()
        if base + n > 65535:
            continue
        socks = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()


class LiveApp:
    """``with LiveApp(asgi_app) as url:`` serves the app on 127.0.0.1 until the block ends."""

    def __init__(self, app, after=None):
        """``after``: a coroutine function run on the server's loop once it has stopped."""
        self.app = app
        self.after = after
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.loop: asyncio.AbstractEventLoop | None = None

    def __enter__(self) -> str:
        self.server = uvicorn.Server(
            uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning")
        )

        def run():
            self.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self.server.serve())
            if self.after is not None:
                self.loop.run_until_complete(self.after())

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 120
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.05)
        return self.url

    def call(self, coro, timeout: float = 30):
        """Run a coroutine on the server's loop (e.g. to poke the pool) and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(60)


class LiveServer(LiveApp):
    """``with LiveServer(service, clients_factory) as url:``: the router app over ``service``,
    with the clients ``clients_factory()`` returns registered at startup."""

    def __init__(self, service: RouterService, make_clients: Callable[[], Sequence] = lambda: ()):
        self.service = service

        async def register():
            for c in make_clients():
                await service.add_worker(c)

        super().__init__(build_app(service, on_startup=[register]), after=service.close)


def local_client(host):
    """The router's client for an in-process ``WorkerHost`` (the same encoded calls as over a
    network; closing it shuts the worker down)."""
    from radixray.protocol import LocalTransport, WorkerClient

    return WorkerClient(LocalTransport(host, f"local:{host.worker_id}"), host.worker_id)


def ray_clients(handles: dict) -> list:
    """The router's clients for ``{worker_id: actor handle}``."""
    from radixray.protocol import RayTransport, WorkerClient

    return [WorkerClient(RayTransport(h), w) for w, h in handles.items()]


def inprocess_service(
    n_workers: int = 2, page_size: int = 4, engine: dict | None = None, **settings
):
    """A RouterService over ``n_workers`` real in-process WorkerHosts on the tiny model."""
    from radixray.model_meta import load_model_meta
    from radixray.router.service import RouterService, RouterSettings
    from radixray.worker import WorkerHost

    settings.setdefault("poll_interval_s", 0.1)
    service = RouterService(
        load_model_meta("tiny"), RouterSettings(page_size=page_size, **settings)
    )
    cfg = {"model": "tiny", "page_size": page_size} | (engine or {})
    hosts = [WorkerHost(cfg, f"w{i}") for i in range(n_workers)]
    return service, hosts, lambda: [local_client(h) for h in hosts]


def stream_completion(url: str, body: dict, timeout: float = 120, stop_after: int | None = None):
    """POST a streaming completion and read its SSE events. Returns a dict: status, worker,
    chunks (text pieces), error (an SSE error event's message, if any), done ([DONE] seen).
    ``stop_after``: close the connection after that many events (a client that goes away)."""
    import json

    import httpx

    out = {
        "status": None,
        "worker": None,
        "chunks": [],
        "error": None,
        "done": False,
        "finish_reason": None,
    }
    with (
        httpx.Client(timeout=timeout) as client,
        client.stream("POST", f"{url}/v1/completions", json=body | {"stream": True}) as r,
    ):
        out["status"] = r.status_code
        out["worker"] = r.headers.get("x-radixray-worker")
        if r.status_code != 200:
            r.read()
            out["error"] = r.text
            return out
        events = 0
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                out["done"] = True
                break
            obj = json.loads(data)
            if "error" in obj:
                out["error"] = obj["error"]["message"]
                continue
            for ch in obj.get("choices", []):
                out["chunks"].append(ch.get("text", ""))
                if ch.get("finish_reason"):
                    out["finish_reason"] = ch["finish_reason"]
            events += 1
            if stop_after is not None and events >= stop_after:
                break
    return out


def worker_server(worker_id: str, num_pages: int | None = 512, token: str | None = None, **engine):
    """``(LiveApp, host)``: a real ``radixray worker`` app (tiny model, page size 16) on
    127.0.0.1; enter the LiveApp to serve it, shut the host down after."""
    from radixray.worker import WorkerHost
    from radixray.worker.http_server import WorkerServer

    cfg = {"model": "tiny", "page_size": 16, "num_pages": num_pages} | engine
    host = WorkerHost(cfg, worker_id)
    return LiveApp(WorkerServer(host, token=token)), host


@contextlib.contextmanager
def served(kind: str, n_workers: int = 2, **worker_engine):
    """``(url, hosts)``: a router (``kind="router"``: ttft over ``n_workers`` in-process workers)
    or one worker's own server (``kind="worker"``), serving the OpenAI API on 127.0.0.1. On a
    clean exit every request has given its pages back; the hosts are shut down either way."""
    if kind == "router":
        service, hosts, clients = inprocess_service(n_workers, policy="ttft")
        server = LiveServer(service, clients)
    else:
        server, host = worker_server("w0", **worker_engine)
        hosts = [host]
    try:
        with server as url:
            yield url, hosts
        for h in hosts:
            assert h.engine.cache.protected_tokens == 0
    finally:
        for h in hosts:
            h.shutdown()
