"""``SSEResponse``: a text/event-stream answer from an async iterator of encoded events.

Starlette's ``StreamingResponse`` runs every streaming answer in an anyio task group (one task
sends, one listens for the client leaving) under uvicorn's ASGI 2.3; on the router's hot path
that cost more than the rest of the response. Here one small task listens, and the client
leaving cancels the sending task, which closes the event iterator (and so aborts the request on
its worker).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

from starlette.responses import Response

__all__ = ["SSEResponse"]


class SSEResponse(Response):
    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes], headers: Mapping[str, str] | None = None):
        self.events = events
        self.status_code = 200
        self.background = None
        self.init_headers(headers)

    async def __call__(self, scope, receive, send) -> None:
        sender = asyncio.current_task()
        gone = False

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            sender.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for event in self.events:
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not gone:
                raise
            if hasattr(sender, "uncancel"):  # the cancel was ours, not the server's
                sender.uncancel()
        finally:
            watcher.cancel()
            await self.events.aclose()
