"""Running an ASGI app (the router's or a worker's) until interrupted, on uvloop with httptools
where installed."""

from __future__ import annotations

import asyncio

__all__ = ["loop_factory", "serve_uvicorn"]


def serve_uvicorn(app, host: str, port: int, on_ready=None) -> None:
    """Serve ``app`` until interrupted, on uvloop with httptools where installed (the event
    loop and the HTTP parser in C: a router spends most of its CPU in them)."""
    import uvicorn

    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", lifespan="on", http="auto", loop="none"
    )
    server = uvicorn.Server(config)

    async def run():
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started and on_ready:
            on_ready()
        await task

    factory = loop_factory()
    if factory is None or not hasattr(asyncio, "Runner"):  # Python 3.10: the standard loop
        asyncio.run(run())
        return
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(run())


def loop_factory():
    try:
        import uvloop
    except ImportError:  # not on this platform: the standard loop
        return None
    return uvloop.new_event_loop
