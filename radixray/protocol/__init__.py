"""The boundary between router and workers: typed messages, one error channel, one codec.

Pure Python, no torch: a router imports this and never the worker. See ``messages.py`` for the
messages, ``errors.py`` for the error kinds, ``rpc.py`` for the calls and the client, and
``transports.py`` / ``http_transport.py`` for how calls move.
"""

from .codec import ProtocolError, decode, encode
from .errors import (
    Aborted,
    EngineFailure,
    ErrorKind,
    InvalidRequest,
    Overloaded,
    RequestError,
    WorkerUnavailable,
    error_for,
)
from .messages import (
    FINISH_REASONS,
    MAX_LOGPROBS,
    MISS_CAUSES,
    PROTOCOL_VERSION,
    TRAFFIC_FIELDS,
    AbortRequest,
    Ack,
    Empty,
    ErrorInfo,
    GenerateRequest,
    GrammarSpec,
    Health,
    LoadReport,
    PollRequest,
    PollResult,
    SamplingParams,
    StreamChunk,
    TokenLogprob,
    WorkerCounters,
    WorkerInfo,
    cache_view,
)
from .rpc import METHODS, Method, Transport, WorkerClient, WorkerHandler, serve_call, serve_stream
from .transports import LocalTransport, RayHttpTransport, RayTransport

__all__ = [
    "FINISH_REASONS",
    "METHODS",
    "MISS_CAUSES",
    "MAX_LOGPROBS",
    "PROTOCOL_VERSION",
    "TRAFFIC_FIELDS",
    "AbortRequest",
    "Aborted",
    "Ack",
    "Empty",
    "EngineFailure",
    "ErrorInfo",
    "ErrorKind",
    "GenerateRequest",
    "Health",
    "InvalidRequest",
    "LoadReport",
    "LocalTransport",
    "Method",
    "Overloaded",
    "PollRequest",
    "PollResult",
    "ProtocolError",
    "RayHttpTransport",
    "RayTransport",
    "RequestError",
    "GrammarSpec",
    "SamplingParams",
    "StreamChunk",
    "TokenLogprob",
    "Transport",
    "WorkerClient",
    "WorkerCounters",
    "WorkerHandler",
    "WorkerInfo",
    "WorkerUnavailable",
    "cache_view",
    "decode",
    "encode",
    "error_for",
    "serve_call",
    "serve_stream",
]
