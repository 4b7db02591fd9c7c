"""Every message between a router and a worker, as typed structs (msgspec).

Requests and replies of the worker protocol (see ``rpc.py`` for which goes with which)::

    router                                   worker
    GenerateRequest  ------ generate ----->  StreamChunk, StreamChunk, ..., final StreamChunk
    AbortRequest     ------ abort -------->  Ack
    PollRequest      ------ poll --------->  PollResult (LoadReport, WorkerCounters, KV events)
    Empty            ------ info --------->  WorkerInfo
    Empty            ------ health ------->  Health
                     any call may end in ->  ErrorInfo (see errors.py)

Top-level messages carry a tag ``"<name>/<version>"`` as their first element, so a decoder knows
what it holds and refuses a message from another protocol version by name instead of
misreading it. Structs are encoded as arrays (``array_like``): fields are positional, so a new
field goes at the end with a default.

Token ids travel as plain lists of ints: msgspec writes 2,048 of them in ~8 us and reads and
checks them in ~45 us, most of it creating the int objects, which any decoder must
(benchmarks/bench_protocol.py); no packing needed.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import msgspec
from msgspec import Meta, Struct, field

from .errors import ErrorKind, InvalidRequest, RequestError, error_for
from .grammar_spec import GRAMMAR_KINDS, GrammarSpec  # noqa: F401 (re-exported)
from .logprobs import MAX_LOGPROBS, TokenLogprob, join_logprobs

__all__ = [
    "MISS_CAUSES",
    "FINISH_REASONS",
    "TRAFFIC_FIELDS",
    "PROTOCOL_VERSION",
    "SamplingParams",
    "GenerateRequest",
    "StreamChunk",
    "TokenLogprob",
    "MAX_LOGPROBS",
    "ErrorInfo",
    "AbortRequest",
    "Ack",
    "PollRequest",
    "LoadReport",
    "WorkerCounters",
    "cache_view",
    "PollResult",
    "WorkerInfo",
    "Health",
    "Empty",
]

PROTOCOL_VERSION = 4  # what each version changed: docs/architecture.md, "Versioning"

# Why a prompt token was or was not reused; they add up to the prompt length.
#   cached     reused from the prefix cache
#   cold       never seen by this worker
#   evicted    this worker held it once (ghost list) and evicted it
#   page_tail  the unaligned tail, or the page holding the last prompt token (logits need it)
#   in_flight  another running request was computing it at the same time
#   disabled   the cache is a ChunkCache (reuse off)
MISS_CAUSES = ("cached", "cold", "evicted", "page_tail", "in_flight", "disabled")
FINISH_REASONS = ("stop", "length", "abort")

NonNegInt = Annotated[int, Meta(ge=0)]
TokenId = Annotated[int, Meta(ge=0, lt=2**31)]


def _tag(name: str) -> str:
    return f"{name}/{PROTOCOL_VERSION}"


class SamplingParams(Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """How to sample one request. Built once at the edge, validated on construction (and on
    decode), carried as this object to the engine."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # The logits controls (vLLM's semantics; radixray.worker.logits_controls applies them):
    min_p: float = 0.0  # 0: off
    presence_penalty: float = 0.0  # over the generated tokens
    frequency_penalty: float = 0.0  # over the generated tokens
    repetition_penalty: float = 1.0  # over prompt + generated tokens; 1: off
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs, sorted by id
    min_tokens: int = 0  # EOS and stop_token_ids cannot end the request before this many
    # Log-probabilities of the raw logits (before temperature and every control): None: off;
    # k: each sampled (prompt) token's logprob and its k most likely alternatives.
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    grammar: GrammarSpec | None = None  # structured output (radixray.worker.grammar)

    def __post_init__(self) -> None:
        def bad(name: str, want: str):
            raise InvalidRequest(
                f"SamplingParams.{name} must be {want}, got {getattr(self, name)!r}", name
            )

        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            bad("max_tokens", "an int >= 1")
        if self.max_tokens < 1:
            bad("max_tokens", "an int >= 1")
        for name, lo, hi, want in (
            ("temperature", 0.0, 100.0, "a number in [0, 100]"),
            ("top_p", 0.0, 1.0, "a number in (0, 1]"),
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                bad(name, want)
            if not (lo <= v <= hi) or (name == "top_p" and v == 0.0):
                bad(name, want)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
            bad("top_k", "-1 (off) or an int >= 1")
        if self.top_k == 0 or self.top_k < -1:
            bad("top_k", "-1 (off) or an int >= 1")
        if self.seed is not None and (
            isinstance(self.seed, bool)
            or not isinstance(self.seed, int)
            or not -(2**63) <= self.seed < 2**63
        ):
            bad("seed", "None or an int in the 64-bit signed range")
        stop = self.stop
        if isinstance(stop, str):
            stop = (stop,)
        if not isinstance(stop, tuple):
            stop = tuple(stop)
        if stop is not self.stop:
            msgspec.structs.force_setattr(self, "stop", stop)
        if any(not isinstance(s, str) or not s for s in stop):
            bad("stop", "a list of non-empty strings")
        if not isinstance(self.stop_token_ids, tuple):
            msgspec.structs.force_setattr(self, "stop_token_ids", tuple(self.stop_token_ids))
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            bad("stop_token_ids", "a list of token ids >= 0")
        self._check_controls(bad)

    def _check_controls(self, bad) -> None:
        for name, lo, hi, want in (
            ("min_p", 0.0, 1.0, "a number in [0, 1]"),
            ("presence_penalty", -2.0, 2.0, "a number in [-2, 2]"),
            ("frequency_penalty", -2.0, 2.0, "a number in [-2, 2]"),
            ("repetition_penalty", 0.0, math.inf, "a finite number > 0"),
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (lo <= v <= hi):
                bad(name, want)
            if name == "repetition_penalty" and not 0.0 < v < math.inf:
                bad(name, want)
        bias = self.logit_bias
        want = "token id -> a number in [-100, 100]"
        try:
            pairs = sorted(bias.items() if isinstance(bias, dict) else (tuple(b) for b in bias))
        except (TypeError, ValueError):
            bad("logit_bias", want)
        for pair in pairs:
            if len(pair) != 2:
                bad("logit_bias", want)
            t, v = pair
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < 2**31:
                bad("logit_bias", want)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
                bad("logit_bias", want)
        if len({t for t, _ in pairs}) != len(pairs):
            bad("logit_bias", "a token id at most once")
        pairs = tuple((t, float(v)) for t, v in pairs)
        if pairs != bias:
            msgspec.structs.force_setattr(self, "logit_bias", pairs)
        m = self.min_tokens
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            bad("min_tokens", "an int >= 0")
        if m > self.max_tokens:
            bad("min_tokens", f"at most max_tokens ({self.max_tokens})")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None and (type(v) is not int or not 0 <= v <= MAX_LOGPROBS):
                bad(name, f"None or an int in [0, {MAX_LOGPROBS}]")

    @property
    def uses_controls(self) -> bool:
        """True if any logits control is on (the sampler's fast path skips rows without)."""
        return bool(
            self.min_p
            or self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.logit_bias
            or self.min_tokens
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def replace(self, **changes: Any) -> SamplingParams:
        return msgspec.structs.replace(self, **changes)


class GenerateRequest(Struct, frozen=True, array_like=True, tag=_tag("generate")):
    """Generate from ``prompt_ids``. ``extra_key`` partitions the prefix cache (a tenant's
    ``cache_salt``): requests with different keys never share a cached page."""

    request_id: Annotated[str, Meta(min_length=1, max_length=256)]
    prompt_ids: Annotated[list[TokenId], Meta(min_length=1)]
    params: SamplingParams
    extra_key: Annotated[str, Meta(max_length=256)] | None = None


class StreamChunk(Struct, frozen=True, array_like=True, tag=_tag("chunk")):
    """New tokens of one request: every token sampled since the previous chunk (several when the
    reader fell behind the engine, never fewer than one per chunk except in a final one).

    ``cached_tokens`` is known from admission on, so every chunk carries it (a router puts it in
    response headers with the first token). The final chunk has ``finish_reason`` and the
    usage: prompt and completion tokens and ``miss``, the prompt tokens by cause (MISS_CAUSES).
    """

    token_ids: list[int]
    text: str
    cached_tokens: NonNegInt = 0
    finish_reason: str | None = None
    prompt_tokens: NonNegInt = 0
    completion_tokens: NonNegInt = 0
    miss: dict[str, int] | None = None
    # One per token of ``token_ids`` (asked for); the prompt's with the first token's chunk.
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None

    @property
    def final(self) -> bool:
        return self.finish_reason is not None

    def merge(self, later: StreamChunk) -> StreamChunk:
        """This chunk followed by ``later``, as one (the final fields come from ``later``)."""
        return StreamChunk(
            self.token_ids + later.token_ids,
            self.text + later.text,
            later.cached_tokens,
            later.finish_reason,
            later.prompt_tokens,
            later.completion_tokens,
            later.miss,
            join_logprobs(self.logprobs, later.logprobs),
            self.prompt_logprobs if self.prompt_logprobs is not None else later.prompt_logprobs,
        )


class ErrorInfo(Struct, frozen=True, array_like=True, tag=_tag("error")):
    """A failed call, on the wire (see errors.py for the kinds)."""

    kind: ErrorKind
    message: str
    param: str | None = None

    @classmethod
    def of(cls, error: RequestError) -> ErrorInfo:
        return cls(error.kind, error.message, error.param)

    def exception(self) -> RequestError:
        return error_for(self.kind, self.message, self.param)


class AbortRequest(Struct, frozen=True, array_like=True, tag=_tag("abort")):
    request_id: str


class Ack(Struct, frozen=True, array_like=True, tag=_tag("ack")):
    pass


class Empty(Struct, frozen=True, array_like=True, tag=_tag("empty")):
    pass


class PollRequest(Struct, frozen=True, array_like=True, tag=_tag("poll")):
    """The KV events after batch ``since_seq`` of worker incarnation ``epoch`` (-1 / None: the
    caller has nothing yet and gets a snapshot)."""

    since_seq: int = -1
    epoch: str | None = None
    router_id: str | None = None  # who asks: the worker lists the routers that poll it


# The load fields a router tallies for its own traffic as requests move (the rest of a report
# is measured by the worker only).
TRAFFIC_FIELDS = ("running", "waiting", "queued_prefill_tokens", "active_decode_tokens")


class LoadReport(Struct, frozen=True, array_like=True):
    """What a worker is doing, and how fast it is, when it answered a poll."""

    running: int = 0
    waiting: int = 0  # admitted to the worker, not yet scheduled (its inbox included)
    queued_prefill_tokens: int = 0  # prompt tokens still to prefill, waiting and running
    active_decode_tokens: int = 0  # context tokens of running requests
    free_pages: int = 0
    total_pages: int = 0
    cached_pages: int = 0
    evictable_pages: int = 0
    # Prefill step cost overhead + tokens / rate (None before any prefill step) and the fit's
    # five weighted moments, so a router can pool identical workers (radixray.step_cost).
    prefill_tokens_per_s: float | None = None
    prefill_overhead_s: float | None = None
    prefill_fit_moments: tuple[float, float, float, float, float] = (0.0, 0.0, 0.0, 0.0, 0.0)
    decode_step_s: float | None = None
    decode_tokens_per_s: float | None = None
    hit_rate: float = 0.0
    preemptions: int = 0
    evicted_pages: int = 0
    # The routers that polled this worker lately (sorted ids): how routers learn of each other
    # without a store of their own.
    routers: tuple[str, ...] = ()


class WorkerCounters(Struct, frozen=True, array_like=True):
    """Cumulative counters since the worker started (a run's figures are differences)."""

    requests_finished: int = 0
    requests_aborted: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    miss_tokens: dict[str, int] = field(default_factory=dict)
    steps: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0


def cache_view(load: LoadReport, counters: WorkerCounters) -> dict:
    """A worker's cache as ``/debug/cache`` shows it (router and worker alike)."""
    return {
        "hit_rate": load.hit_rate,
        "prompt_tokens": counters.prompt_tokens,
        "cached_tokens": counters.cached_tokens,
        "miss_tokens": dict(counters.miss_tokens),
        "evicted_pages": load.evicted_pages,
        "preemptions": load.preemptions,
        "cached_pages": load.cached_pages,
        "free_pages": load.free_pages,
        "total_pages": load.total_pages,
    }


class PollResult(Struct, frozen=True, array_like=True, tag=_tag("poll_result")):
    """The answer to a poll: load, counters and the KV events since the caller's ``since_seq``.

    ``events`` is one msgpack ``EventBatch`` (``radixray.cache_index.events``, vLLM's field
    names). ``snapshot``: the caller missed events (new router, restarted worker, a log overrun),
    so the batch is ``AllBlocksCleared`` followed by every cached chain. ``alive`` is False once
    the worker's engine stopped for good (it serves nothing more).
    """

    worker_id: str
    epoch: str
    seq: int
    snapshot: bool
    events: bytes
    alive: bool
    load: LoadReport
    counters: WorkerCounters


class WorkerInfo(Struct, frozen=True, array_like=True, tag=_tag("info")):
    """Who a worker is. ``address`` is where it listens (HTTP workers) or its Ray actor id: two
    workers claiming one id are told apart by it. ``perf_class``: workers that share it run at
    the same speed, so a router pools their step-cost measurements. ``http_url``: where its
    internal routes are served, for a worker actor that runs an HTTP server too."""

    worker_id: str
    epoch: str
    model: str
    page_size: int
    max_model_len: int
    vocab_size: int
    cache: str
    num_pages: int
    device: str
    perf_class: str
    address: str | None = None
    pid: int | None = None
    node_ip: str | None = None
    node_id: str | None = None
    protocol: int = PROTOCOL_VERSION
    http_url: str | None = None  # its HTTP server (internal routes), when it runs one


class Health(Struct, frozen=True, array_like=True, tag=_tag("health")):
    ok: bool
    worker_id: str
    uptime_s: float
    detail: str | None = None
