"""One error channel between router and worker: a kind, a message, the field at fault.

Every failure a request can meet has exactly one kind, whichever side or transport it happens
on. In a process it is a :class:`RequestError` (one subclass per kind); on the wire it is an
:class:`~radixray.protocol.messages.ErrorInfo` frame; the receiving client turns the frame back
into the same exception. The HTTP edge maps a kind to one status code.

    kind                 whose fault        what the router does          HTTP at the edge
    invalid_request      the client's       answers it, never retries     400
    engine_failure       the worker's       retries elsewhere, once       500 after retries
    worker_unavailable   the transport's    marks it down, retries        503 after retries
    overloaded           nobody's           retries elsewhere             429 + Retry-After
    aborted              (client left)      nothing to answer             499
"""

from __future__ import annotations

import enum

__all__ = [
    "ErrorKind",
    "RequestError",
    "InvalidRequest",
    "EngineFailure",
    "WorkerUnavailable",
    "Overloaded",
    "Aborted",
    "error_for",
]


class ErrorKind(enum.Enum):
    INVALID_REQUEST = "invalid_request"
    ENGINE_FAILURE = "engine_failure"
    WORKER_UNAVAILABLE = "worker_unavailable"
    OVERLOADED = "overloaded"
    ABORTED = "aborted"


class RequestError(Exception):
    """A request failed. ``param`` names the request field at fault, when one is."""

    kind: ErrorKind

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, param={self.param!r})"


class InvalidRequest(RequestError, ValueError):
    """The request itself is bad (a field out of range, too long for the context): the client's
    fault, the same on every worker. Also a ``ValueError``, so plain callers can catch that."""

    kind = ErrorKind.INVALID_REQUEST


class EngineFailure(RequestError, RuntimeError):
    """The worker's engine failed while running the request: another worker may serve it."""

    kind = ErrorKind.ENGINE_FAILURE


class WorkerUnavailable(RequestError, RuntimeError):
    """The worker cannot be reached, died or stopped: it leaves routing; the request may be
    retried elsewhere if it has not streamed a token yet."""

    kind = ErrorKind.WORKER_UNAVAILABLE


class Overloaded(RequestError, RuntimeError):
    """Too much work is queued to accept this request now; retry later or elsewhere.
    ``retry_after_s``: when the refusal knows how long the backlog takes to drain (the router's
    queueing-delay limit), the seconds a client should wait; None: the server's default."""

    kind = ErrorKind.OVERLOADED

    def __init__(self, message: str, param: str | None = None, retry_after_s: int | None = None):
        super().__init__(message, param)
        self.retry_after_s = retry_after_s


class Aborted(RequestError):
    """The request was aborted before it finished (its client went away)."""

    kind = ErrorKind.ABORTED


_BY_KIND: dict[ErrorKind, type[RequestError]] = {
    cls.kind: cls for cls in (InvalidRequest, EngineFailure, WorkerUnavailable, Overloaded, Aborted)
}


def error_for(kind: ErrorKind, message: str, param: str | None = None) -> RequestError:
    """The exception of ``kind``."""
    return _BY_KIND[kind](message, param)
