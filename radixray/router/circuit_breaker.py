"""A per-worker circuit breaker.

    closed ──(failure_threshold consecutive failures, or trip())──> open
    open ──(cooldown elapsed)──> half_open: one probe (the next poll) may go through
    half_open ──probe ok──> closed        half_open ──probe fails──> open, cooldown doubled

Only a closed breaker takes traffic. The cooldown grows up to ``max_cooldown_s`` while a worker
keeps failing, so a dead worker costs one cheap probe now and then, not a call per poll.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["CircuitBreaker"]


class CircuitBreaker:
    CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"

    def __init__(
        self,
        failure_threshold: int = 2,
        cooldown_s: float = 0.5,
        max_cooldown_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if failure_threshold < 1:
            raise ValueError(f"failure_threshold must be >= 1, got {failure_threshold}")
        self.failure_threshold = failure_threshold
        self.base_cooldown_s = cooldown_s
        self.max_cooldown_s = max_cooldown_s
        self._clock = clock
        self._state = self.CLOSED
        self._failures = 0
        self._cooldown_s = cooldown_s
        self._opened_at = 0.0
        self.opened_count = 0

    @property
    def state(self) -> str:
        if self._state == self.OPEN and self._clock() - self._opened_at >= self._cooldown_s:
            self._state = self.HALF_OPEN
        return self._state

    @property
    def closed(self) -> bool:
        return self.state == self.CLOSED

    def may_probe(self) -> bool:
        """True when a call may go out: closed, or half-open (the probe)."""
        return self.state != self.OPEN

    def record_success(self) -> bool:
        """Returns True if this success closed an open/half-open breaker."""
        reopened = self._state != self.CLOSED
        self._state = self.CLOSED
        self._failures = 0
        self._cooldown_s = self.base_cooldown_s
        return reopened

    def record_failure(self) -> bool:
        """Returns True if this failure opened the breaker."""
        if self.state == self.HALF_OPEN:
            self._cooldown_s = min(self._cooldown_s * 2, self.max_cooldown_s)
            self._open()
            return False  # it was already out of service
        self._failures += 1
        if self._state == self.CLOSED and self._failures >= self.failure_threshold:
            self._open()
            return True
        return False

    def trip(self) -> bool:
        """Open at once (the worker is known dead). Returns True if it was closed."""
        was_closed = self._state == self.CLOSED
        self._open()
        return was_closed

    def _open(self) -> None:
        if self._state == self.CLOSED:
            self.opened_count += 1
        self._state = self.OPEN
        self._opened_at = self._clock()
