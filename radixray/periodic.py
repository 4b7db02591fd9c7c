"""``Periodic``: one coroutine run every ``period_s`` on the running event loop until stopped.

The router's worker poll, its fleet-metrics publisher and the Serve ingress's replica
membership are each one of these. A tick that raises is logged and the next one runs on time:
a feed that dies on one bad answer would leave the router routing on a stale picture.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

__all__ = ["Periodic"]


class Periodic:
    def __init__(
        self, tick: Callable[[], Awaitable[object]], period_s: float, what: str, log: logging.Logger
    ):
        self.tick = tick
        self.period_s = period_s
        self.what = what  # names the tick in the log line of a failure
        self.log = log
        self._task: asyncio.Task | None = None

    @property
    def running(self) -> bool:
        return self._task is not None

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:  # log and keep going: the next tick may well succeed
                self.log.exception("%s failed", self.what)
            await asyncio.sleep(self.period_s)

    def start(self) -> None:
        """Start ticking (the first tick runs at once); a second start does nothing."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Cancel the loop and wait for it; a tick in progress is cancelled too."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
