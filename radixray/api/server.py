"""The one place that starts uvicorn: an ASGI app (the router's or a worker's) served until
interrupted (``serve_uvicorn``, the CLI's), or on an event loop that already runs
(``start_uvicorn``, a Ray worker actor's own HTTP server)."""

from __future__ import annotations

import asyncio
import gc

__all__ = ["NotListening", "loop_factory", "serve_uvicorn", "settle_gc", "start_uvicorn"]

YOUNG_GC_THRESHOLD = 20_000  # allocations between young-generation collections (Python: 700)


class NotListening(RuntimeError):
    """uvicorn stopped before it listened (its startup failed; it has logged why)."""


async def start_uvicorn(app, host: str, port: int = 0, lifespan: str = "off"):
    """Serve ``app`` on the running event loop; returns ``(server, task, port)`` once it
    listens (``port`` 0: any free port, the bound one is returned). Stop it with
    ``server.should_exit = True``; ``task`` ends when it has stopped."""
    import uvicorn

    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", lifespan=lifespan, http="auto", loop="none"
    )
    server = uvicorn.Server(config)
    task = asyncio.get_running_loop().create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()  # raises why it could not start
            raise NotListening(f"the HTTP server stopped before it listened on {host}:{port}")
        await asyncio.sleep(0.02)
    bound = server.servers[0].sockets[0].getsockname()[1]
    return server, task, bound


def serve_uvicorn(app, host: str, port: int, on_ready=None) -> None:
    """Serve ``app`` until interrupted, on uvloop with httptools where installed (the event
    loop and the HTTP parser in C: a router spends most of its CPU in them)."""

    async def run():
        try:
            _, task, _ = await start_uvicorn(app, host, port, lifespan="on")
        except NotListening:
            return  # the app's startup failed: uvicorn has logged why
        settle_gc()  # started: what the process keeps for its life is built
        if on_ready:
            on_ready()
        await task

    factory = loop_factory()
    if factory is None or not hasattr(asyncio, "Runner"):  # Python 3.10: the standard loop
        asyncio.run(run())
        return
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(run())


def settle_gc(young: int = YOUNG_GC_THRESHOLD) -> None:
    """For a serving process once it has started: move what it built to keep (modules, the
    app, its tables) out of the cyclic collector's sight (``gc.freeze``), and collect the young
    generation every ``young`` allocations instead of 700. A request allocates hundreds of
    short-lived objects, so at the default the collector ran several times a request, each time
    walking young objects and now and then the whole heap: ~5% of a router's CPU samples, none
    after (benchmarks/HISTORY.md, "Quiet remeasurement"). The older generations keep their
    thresholds; what is frozen is never collected, so this runs once, after start-up."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, old)


def loop_factory():
    try:
        import uvloop
    except ImportError:  # not on this platform: the standard loop
        return None
    return uvloop.new_event_loop
