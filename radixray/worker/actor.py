"""The worker as a Ray actor: ``ray.remote`` around ``HttpWorkerHost``, a ``WorkerHost``
(``host.py``) that can also serve itself over HTTP.

A router reaches it through ``radixray.protocol.RayTransport``: ``call(method, payload)`` and
the streaming generator ``stream(method, payload)``, bytes in and out (the protocol's codec),
so nothing is pickled between router and worker; or over the actor's own HTTP server
(``start_http``, ``radixray.protocol.RayHttpTransport``).
"""

from __future__ import annotations

import sys

from .host import WorkerHost

__all__ = ["HttpWorkerHost", "WorkerActor", "worker_actor_options"]


def worker_actor_options(
    use_gpu: bool,
    num_cpus: float = 0.5,
    resources: dict | None = None,
    max_concurrency: int = 1000,
) -> dict:
    """Ray options for one worker: a whole GPU, or a fraction of a CPU; optional custom resources
    pin it to a node (``{"node:1.2.3.4": 0.01}`` or a label of the cluster's own)."""
    opts: dict = {"max_concurrency": max_concurrency, "resources": dict(resources or {})}
    if use_gpu:
        opts.update(num_gpus=1, num_cpus=1)
    else:
        opts.update(num_gpus=0, num_cpus=num_cpus)
    return opts


class HttpWorkerHost(WorkerHost):
    """A ``WorkerHost`` that serves its HTTP face (``WorkerServer``) on its own event loop when
    asked (the Ray actor's class; a plain class, usable without Ray)."""

    _http_server = None  # the uvicorn server, once started

    async def start_http(
        self, host: str | None = None, port: int = 0, token: str | None = None
    ) -> str:
        """Serve this worker's HTTP face (``WorkerServer``: the internal routes behind
        ``token``, the probes, the OpenAI API) on this process's event loop, next to whatever
        else reaches it; returns its URL. ``host``: default this node's IP (Ray's view of it),
        so routers on other nodes reach it; ``port`` 0: any free port. Idempotent."""
        if self.http_url is not None:
            return self.http_url
        from radixray.api.server import start_uvicorn

        from .http_server import WorkerServer

        host = host or _node_ip() or "127.0.0.1"
        server, _, bound = await start_uvicorn(WorkerServer(self, token=token), host, port)
        self._http_server = server
        self.http_url = f"http://{f'[{host}]' if ':' in host else host}:{bound}"
        return self.http_url

    def shutdown(self) -> None:
        if self._http_server is not None:
            self._http_server.should_exit = True
        super().shutdown()


def _node_ip() -> str | None:
    """This node's IP as Ray sees it, inside a Ray process; None outside one."""
    ray = sys.modules.get("ray")
    return ray.util.get_node_ip_address() if ray is not None and ray.is_initialized() else None


class _RemoteClass:
    """``WorkerActor`` is ``ray.remote(HttpWorkerHost)``, built on first use so that importing
    this module does not import Ray."""

    _cls = None

    def __getattr__(self, name):
        if _RemoteClass._cls is None:
            import ray

            _RemoteClass._cls = ray.remote(HttpWorkerHost)
        return getattr(_RemoteClass._cls, name)


WorkerActor = _RemoteClass()
