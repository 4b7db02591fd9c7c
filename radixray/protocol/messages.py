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

from typing import Annotated, Any

import msgspec
from msgspec import Meta, Struct, field

from .errors import ErrorKind, RequestError, error_for
from .grammar_spec import GRAMMAR_KINDS, GrammarSpec  # noqa: F401 (re-exported)
from .logprobs import MAX_LOGPROBS, TokenLogprob, join_logprobs
from .miss_causes import MISS_CAUSES
from .sampling_checks import MAX_SAMPLES, check_sampling_params

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
    "MAX_SAMPLES",
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

PROTOCOL_VERSION = 11  # what each version changed: docs/architecture.md, "Versioning"

# MISS_CAUSES: miss_causes.py
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
    # Samples of the prompt: one prefill, then n sequences (sample i seeded seed + i).
    n: int = 1

    def __post_init__(self) -> None:
        check_sampling_params(self)

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
    def penalized(self) -> bool:
        """True if a penalty counts the tokens so far (presence, frequency, repetition)."""
        return bool(
            self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
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
    response headers with the first token). A sample's last chunk has ``finish_reason`` and the
    usage: prompt and completion tokens and ``miss``, the prompt tokens by cause (MISS_CAUSES).

    A request with ``n`` samples streams all of them on one stream: each chunk is one sample's
    (``index``), and ``samples_open`` counts the request's samples not finished after it. The
    stream ends with the chunk that finishes the last sample (``final``); every sample reports
    the same prompt, ``cached_tokens`` and ``miss`` (the prompt was computed once).
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
    index: NonNegInt = 0  # the sample (0 .. n - 1)
    samples_open: NonNegInt = 0  # the request's samples still generating after this chunk

    @property
    def ended(self) -> bool:
        """This chunk ends its sample."""
        return self.finish_reason is not None

    @property
    def final(self) -> bool:
        """This chunk ends the stream: its sample, and with it the request's last, is done."""
        return self.finish_reason is not None and self.samples_open == 0

    def merge(self, later: StreamChunk) -> StreamChunk:
        """This chunk followed by ``later`` of the same sample, as one (the final fields come
        from ``later``)."""
        if later.index != self.index:
            raise ValueError(f"cannot merge sample {later.index}'s chunk into {self.index}'s")
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
            later.index,
            later.samples_open,
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

    running: int = 0  # decoding: past their prefill, a token of every step's budget each
    # not yet at their first token: queued, in the inbox, or mid-prefill (as a router tallies its
    # own requests, ``router/traffic.py``)
    waiting: int = 0
    queued_prefill_tokens: int = 0  # prompt tokens still to prefill, waiting and running
    active_decode_tokens: int = 0  # context tokens of the decoding (``running``) requests
    free_pages: int = 0
    total_pages: int = 0
    cached_pages: int = 0
    evictable_pages: int = 0
    # Prefill step cost overhead + tokens / rate (None before any prefill step) and the fit's
    # five weighted moments, so a router can pool identical workers (radixray.step_cost); the
    # seconds are each step's whole period (forward, scheduling, sampling, streaming out), as
    # is ``decode_step_s``'s.
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
    # The host tier (docs/host_tier.md): its pages, what it holds, and what a load-back costs
    # here (``overhead + bytes / rate``, fitted over this worker's load-backs like the prefill
    # rate; None before any), with the KV bytes of one token to turn tokens into bytes.
    # ``host_free_pages``: what a demotion can take without losing a prefix, the free pages and
    # the host copies of device-resident pages (``HostTier.spare_pages``).
    host_total_pages: int = 0
    host_free_pages: int = 0
    host_cached_pages: int = 0
    load_bytes_per_s: float | None = None
    load_overhead_s: float | None = None
    kv_bytes_per_token: int = 0
    # The token budget of one engine step (the scheduler's ``max_batch_tokens``): decodes take
    # one token of it each, prefill chunks the rest, so a router can price queued prefill by the
    # steps it takes (``step_cost.queue_wait_seconds``, admission's wait); 0: not reported.
    max_batch_tokens: int = 0
    # Decode cost: what one more decoding sequence adds to a decode-only step's period (the
    # slope of a line through period against batch size, None until the batch sizes seen can
    # separate it from the fixed cost; ``step_cost.decode_seq_seconds``), the line's moments so a
    # router can pool identical workers, and the tokens a sequence decodes here, on average over
    # the last ones that ended (None before any): with them a router prices the steps a
    # placement's answer adds for the requests already on a worker (docs/ttft_policy.md).
    decode_seq_s: float | None = None
    decode_fit_moments: tuple[float, float, float, float, float] = (0.0, 0.0, 0.0, 0.0, 0.0)
    answer_tokens: float | None = None
    # A hybrid's state pool (worker/state_pool.py): a slot per running request (0, 0: none).
    state_total_slots: int = 0
    state_free_slots: int = 0


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
    # host tier: pages demoted to it, loaded back from it, evicted from it; bytes each way;
    # seconds spent copying (load time)
    demoted_pages: int = 0
    loaded_pages: int = 0
    host_evicted_pages: int = 0
    bytes_to_host: int = 0
    bytes_from_host: int = 0
    copy_seconds: float = 0.0


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
        "host": {
            "total_pages": load.host_total_pages,
            "free_pages": load.host_free_pages,
            "cached_pages": load.host_cached_pages,
            "demoted_pages": counters.demoted_pages,
            "loaded_pages": counters.loaded_pages,
            "evicted_pages": counters.host_evicted_pages,
            "bytes_to_host": counters.bytes_to_host,
            "bytes_from_host": counters.bytes_from_host,
            "copy_seconds": counters.copy_seconds,
            "load_bytes_per_s": load.load_bytes_per_s,
        },
        "state": {"total_slots": load.state_total_slots, "free_slots": load.state_free_slots},
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
