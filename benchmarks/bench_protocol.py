"""Benchmark of the worker protocol's codec: msgspec Structs vs frozen dataclasses + ``msgpack``.

    .venv/bin/python benchmarks/bench_protocol.py            # full run (about a minute)
    .venv/bin/python benchmarks/bench_protocol.py --quick    # small smoke run

The question: does the router <-> worker protocol gain anything from msgspec
(``radixray.protocol``: ``encode(msg)`` / ``decode(data, Type)``) over what the code used before,
plain frozen dataclasses packed with the ``msgpack`` library? Both sides do the same work:

- the same wire format: a positional msgpack array, the tag ``"<name>/1"`` first (msgspec's
  ``array_like=True`` + ``tag``); the two encoders write byte-identical messages, checked below;
- the same checks on decode: the size limit, the tag, the arity (defaults fill missing trailing
  fields; extra trailing fields are ignored, except in SamplingParams, which forbids them), the
  type of every field (ints not bools, strs, bytes, lists of ints, dict[str, int], a 5-tuple of
  floats; an int is accepted for a float field and converted, as msgspec does), the constraints
  (token ids in [0, 2**31), counts >= 0, string lengths) and SamplingParams' range checks (the
  same ``__post_init__`` logic, which msgspec also runs on decode). Before timing, a set of bad
  messages is fed to both decoders and each must refuse every one, and good variants (defaults
  left out, an int temperature, a trailing extra field) must decode to the same message.
The msgspec side is timed through the project's real ``encode`` / ``decode`` (``decode`` adds
~0.1 us over a bare ``msgspec.msgpack.Decoder``: a Python frame, the size check, a cached lookup).

The dataclass side is written as one would for speed: slotted frozen dataclasses, hand-written
field lists for ``msgpack.packb(..., use_bin_type=True)`` (not ``dataclasses.astuple``, which
deep-copies), ``msgpack.unpackb(..., raw=False)`` and a tight check of each field (token ids:
``list(map(type, ids)).count(int) == len(ids)``, twice as fast as ``all(type(t) is int for t in
ids)``, plus ``min``/``max``). ``msgpack.packb`` measured as fast as a reused ``msgpack.Packer``.

Messages (token ids from a 32k vocabulary, every list a fresh list of fresh int objects, built
with ``array('q', ids).tolist()`` outside the timed region, as a server gets them from a
tokenizer or off the wire; each side gets its own objects, 16 different messages per case):

- generate 2,048: a GenerateRequest with a 2,048-token prompt and full SamplingParams.
- generate 64: the same with a 64-token prompt.
- chunk (mid-stream): a StreamChunk with 1 token and a short text.
- chunk (final): the last StreamChunk: finish reason, usage and a ``miss`` dict of 6 causes.
- poll result: a PollResult with 4 KB of KV-event bytes, a LoadReport and WorkerCounters.

Timing: ``time.perf_counter_ns`` around a loop of N calls (N chosen so one run takes ~0.2 s);
7 runs per operation, the implementations interleaved run by run (the machine is shared and
noisy); the median run is reported as microseconds per call. Each figure includes one Python
call and the loop (the empty-loop cost is printed). The garbage collector stays on, as in a
server, with the set-up objects frozen (``gc.freeze()``) so they are not rescanned.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import platform
import random
import statistics
import sys
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from itertools import repeat
from pathlib import Path
from typing import Any

import msgpack
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from radixray.protocol import (  # noqa: E402
    PROTOCOL_VERSION,
    GenerateRequest,
    InvalidRequest,
    LoadReport,
    PollResult,
    ProtocolError,
    SamplingParams,
    StreamChunk,
    WorkerCounters,
    decode,
    encode,
)
from radixray.protocol.codec import MAX_MESSAGE_BYTES  # noqa: E402
from radixray.protocol.grammar_spec import GRAMMAR_KINDS
from radixray.protocol.logprobs import MAX_LOGPROBS
from radixray.protocol.sampling_checks import MAX_SAMPLES
from radixray.sysinfo import cpu_model  # noqa: E402

VOCAB = 32000
POOL = 16  # different messages per case and side, cycled through in the timed loops
TOKEN_LIMIT = 2**31

TAG_GENERATE = GenerateRequest.__struct_config__.tag  # "generate/2"
TAG_CHUNK = StreamChunk.__struct_config__.tag
TAG_POLL = PollResult.__struct_config__.tag

# ------------------------------------------------------------------------------------------------
# The dataclass + msgpack implementation (what the protocol was before msgspec)
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DcSamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    grammar: tuple[str, str] | None = None  # (kind, spec), as GrammarSpec
    n: int = 1

    def __post_init__(self) -> None:
        # radixray.protocol.SamplingParams.__post_init__, line for line (object.__setattr__ for
        # msgspec.structs.force_setattr).
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
            object.__setattr__(self, "stop", stop)
        if any(not isinstance(s, str) or not s for s in stop):
            bad("stop", "a list of non-empty strings")
        if not isinstance(self.stop_token_ids, tuple):
            object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
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
            object.__setattr__(self, "logit_bias", pairs)
        m = self.min_tokens
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            bad("min_tokens", "an int >= 0")
        if m > self.max_tokens:
            bad("min_tokens", f"at most max_tokens ({self.max_tokens})")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            if v is not None and (type(v) is not int or not 0 <= v <= MAX_LOGPROBS):
                bad(name, f"None or an int in [0, {MAX_LOGPROBS}]")
        g = self.grammar
        if g is not None:
            if g[0] not in GRAMMAR_KINDS:
                raise InvalidRequest(f"GrammarSpec.kind must be one of ..., got {g[0]!r}", "x")
            if not isinstance(g[1], str) or len(g[1]) > 1 << 20:
                raise InvalidRequest("GrammarSpec.spec must be a string of at most 1 MiB", "x")
        n = self.n
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SAMPLES:
            bad("n", f"an int in [1, {MAX_SAMPLES}]")


@dataclass(frozen=True, slots=True)
class DcGenerateRequest:
    request_id: str
    prompt_ids: list[int]
    params: DcSamplingParams
    extra_key: str | None = None


@dataclass(frozen=True, slots=True)
class DcTokenLogprob:
    logprob: float
    top_ids: list[int]
    top_logprobs: list[float]


@dataclass(frozen=True, slots=True)
class DcStreamChunk:
    token_ids: list[int]
    text: str
    cached_tokens: int = 0
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    miss: dict[str, int] | None = None
    logprobs: list[DcTokenLogprob] | None = None
    prompt_logprobs: list[DcTokenLogprob | None] | None = None
    index: int = 0
    samples_open: int = 0


@dataclass(frozen=True, slots=True)
class DcLoadReport:
    running: int = 0
    waiting: int = 0
    queued_prefill_tokens: int = 0
    active_decode_tokens: int = 0
    free_pages: int = 0
    total_pages: int = 0
    cached_pages: int = 0
    evictable_pages: int = 0
    prefill_tokens_per_s: float | None = None
    prefill_overhead_s: float | None = None
    prefill_fit_moments: tuple[float, float, float, float, float] = (0.0, 0.0, 0.0, 0.0, 0.0)
    decode_step_s: float | None = None
    decode_tokens_per_s: float | None = None
    hit_rate: float = 0.0
    preemptions: int = 0
    evicted_pages: int = 0
    routers: tuple[str, ...] = ()
    host_total_pages: int = 0
    host_free_pages: int = 0
    host_cached_pages: int = 0
    load_bytes_per_s: float | None = None
    load_overhead_s: float | None = None
    kv_bytes_per_token: int = 0
    max_batch_tokens: int = 0
    decode_seq_s: float | None = None
    decode_fit_moments: tuple[float, float, float, float, float] = (0.0, 0.0, 0.0, 0.0, 0.0)
    answer_tokens: float | None = None
    state_total_slots: int = 0
    state_free_slots: int = 0


@dataclass(frozen=True, slots=True)
class DcWorkerCounters:
    requests_finished: int = 0
    requests_aborted: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    miss_tokens: dict[str, int] = field(default_factory=dict)
    steps: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    demoted_pages: int = 0
    loaded_pages: int = 0
    host_evicted_pages: int = 0
    bytes_to_host: int = 0
    bytes_from_host: int = 0
    copy_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class DcPollResult:
    worker_id: str
    epoch: str
    seq: int
    snapshot: bool
    events: bytes
    alive: bool
    load: DcLoadReport
    counters: DcWorkerCounters


# --- encode: the fields in order, tag first, one packb ------------------------------------------


def dc_encode_generate(m: DcGenerateRequest) -> bytes:
    p = m.params
    return msgpack.packb(
        [
            TAG_GENERATE,
            m.request_id,
            m.prompt_ids,
            [
                p.max_tokens,
                p.temperature,
                p.top_p,
                p.top_k,
                p.seed,
                p.stop,
                p.stop_token_ids,
                p.ignore_eos,
                p.min_p,
                p.presence_penalty,
                p.frequency_penalty,
                p.repetition_penalty,
                p.logit_bias,
                p.min_tokens,
                p.logprobs,
                p.prompt_logprobs,
                None if p.grammar is None else list(p.grammar),
                p.n,
            ],
            m.extra_key,
        ],
        use_bin_type=True,
    )


def dc_encode_chunk(m: DcStreamChunk) -> bytes:
    return msgpack.packb(
        [
            TAG_CHUNK,
            m.token_ids,
            m.text,
            m.cached_tokens,
            m.finish_reason,
            m.prompt_tokens,
            m.completion_tokens,
            m.miss,
            _dc_lp_out(m.logprobs),
            _dc_lp_out(m.prompt_logprobs),
            m.index,
            m.samples_open,
        ],
        use_bin_type=True,
    )


def dc_encode_poll(m: DcPollResult) -> bytes:
    ld, c = m.load, m.counters
    return msgpack.packb(
        [
            TAG_POLL,
            m.worker_id,
            m.epoch,
            m.seq,
            m.snapshot,
            m.events,
            m.alive,
            [
                ld.running,
                ld.waiting,
                ld.queued_prefill_tokens,
                ld.active_decode_tokens,
                ld.free_pages,
                ld.total_pages,
                ld.cached_pages,
                ld.evictable_pages,
                ld.prefill_tokens_per_s,
                ld.prefill_overhead_s,
                ld.prefill_fit_moments,
                ld.decode_step_s,
                ld.decode_tokens_per_s,
                ld.hit_rate,
                ld.preemptions,
                ld.evicted_pages,
                ld.routers,
                ld.host_total_pages,
                ld.host_free_pages,
                ld.host_cached_pages,
                ld.load_bytes_per_s,
                ld.load_overhead_s,
                ld.kv_bytes_per_token,
                ld.max_batch_tokens,
                ld.decode_seq_s,
                ld.decode_fit_moments,
                ld.answer_tokens,
                ld.state_total_slots,
                ld.state_free_slots,
            ],
            [
                c.requests_finished,
                c.requests_aborted,
                c.prompt_tokens,
                c.completion_tokens,
                c.cached_tokens,
                c.miss_tokens,
                c.steps,
                c.prefill_tokens,
                c.decode_tokens,
                c.demoted_pages,
                c.loaded_pages,
                c.host_evicted_pages,
                c.bytes_to_host,
                c.bytes_from_host,
                c.copy_seconds,
            ],
        ],
        use_bin_type=True,
    )


# --- decode: unpack, then check everything msgspec checks ---------------------------------------

_MSGPACK_ERRORS = (ValueError, TypeError, msgpack.UnpackException)
_SP_DEFAULTS = [16, 1.0, 1.0, -1, None, [], [], False, 0.0, 0.0, 0.0, 1.0, [], 0]
_SP_DEFAULTS += [None, None, None, 1]
_SP_FLOATS = (
    "temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"
)  # fmt: skip
_CHUNK_DEFAULTS = [None, None, None, 0, None, 0, 0, None, None, None, 0, 0]  # [0:3] required
_LOAD_DEFAULTS = [0] * 8 + [None, None, (0.0, 0.0, 0.0, 0.0, 0.0), None, None, 0.0, 0, 0, ()]
_LOAD_DEFAULTS += [0, 0, 0, None, None, 0, 0, None, (0.0, 0.0, 0.0, 0.0, 0.0), None, 0, 0]
_LOAD_INTS = (0, 1, 2, 3, 4, 5, 6, 7, 14, 15, 17, 18, 19, 22, 23, 27, 28)
_LOAD_OPT_FLOATS = (8, 9, 11, 12, 20, 21, 24, 26)
_COUNTER_DEFAULTS = [0, 0, 0, 0, 0, None, 0, 0, 0, 0, 0, 0, 0, 0, 0.0]  # None: a fresh {} below
_COUNTER_INTS = (0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13)


def _unpack(data: bytes, tag: str) -> list:
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        obj = msgpack.unpackb(data, raw=False)
    except _MSGPACK_ERRORS as e:
        raise ProtocolError(f"expected a msgpack {tag} message: {e}") from None
    if type(obj) is not list or not obj or obj[0] != tag:
        got = obj[0] if type(obj) is list and obj else type(obj).__name__
        raise ProtocolError(f"expected a {tag} message, got {got!r}")
    return obj


def _bad(tag: str, what: str) -> ProtocolError:
    return ProtocolError(f"invalid {tag} message: {what}")


def _is_str_int_dict(d: Any) -> bool:
    return type(d) is dict and all(type(k) is str and type(v) is int for k, v in d.items())


def _dc_params(p: Any) -> DcSamplingParams:
    n_fields = len(_SP_DEFAULTS)
    if type(p) is not list or len(p) > n_fields:
        raise _bad(TAG_GENERATE, f"params must be an array of at most {n_fields} fields")
    if len(p) < n_fields:
        p = p + _SP_DEFAULTS[len(p) :]
    max_tokens, temperature, top_p, top_k, seed, stop, stop_token_ids, ignore_eos = p[:8]
    min_p, presence, frequency, repetition, logit_bias, min_tokens, logprobs, prompt_lp, g = p[8:17]
    n = p[17]
    if g is not None:
        if type(g) is not list or not 1 <= len(g) <= 2 or type(g[0]) is not str:
            raise _bad(TAG_GENERATE, "params.grammar must be None or an array [kind, spec]")
        if len(g) == 2 and type(g[1]) is not str:
            raise _bad(TAG_GENERATE, "params.grammar spec must be a str")
        g = (g[0], g[1] if len(g) == 2 else "")
    floats = [temperature, top_p, min_p, presence, frequency, repetition]
    for i, (name, v) in enumerate(zip(_SP_FLOATS, floats, strict=True)):
        if type(v) is not float:
            if type(v) is not int:
                raise _bad(TAG_GENERATE, f"params.{name} must be a float")
            floats[i] = float(v)
    temperature, top_p, min_p, presence, frequency, repetition = floats
    if type(logit_bias) is not list or any(
        type(b) is not list
        or len(b) != 2
        or type(b[0]) is not int
        or type(b[1]) not in (int, float)
        for b in logit_bias
    ):
        raise _bad(TAG_GENERATE, "params.logit_bias must be an array of [int, float] pairs")
    if type(stop) is not list or type(stop_token_ids) is not list:
        raise _bad(TAG_GENERATE, "params.stop and params.stop_token_ids must be arrays")
    if type(ignore_eos) is not bool:
        raise _bad(TAG_GENERATE, "params.ignore_eos must be a bool")
    # max_tokens, top_k, seed, the items of stop and stop_token_ids: __post_init__ checks them.
    try:
        return DcSamplingParams(
            max_tokens,
            temperature,
            top_p,
            top_k,
            seed,
            tuple(stop),
            tuple(stop_token_ids),
            ignore_eos,
            min_p,
            presence,
            frequency,
            repetition,
            tuple((t, float(b)) for t, b in logit_bias),
            min_tokens,
            logprobs,
            prompt_lp,
            g,
            n,
        )
    except InvalidRequest as e:
        raise _bad(TAG_GENERATE, str(e)) from None


def dc_decode_generate(data: bytes) -> DcGenerateRequest:
    o = _unpack(data, TAG_GENERATE)
    n = len(o)
    if n < 4:
        raise _bad(TAG_GENERATE, f"expected an array of at least 4 elements, got {n}")
    request_id, ids = o[1], o[2]
    if type(request_id) is not str or not 0 < len(request_id) <= 256:
        raise _bad(TAG_GENERATE, "request_id must be a str of 1 to 256 characters")
    if (
        type(ids) is not list
        or not ids
        or list(map(type, ids)).count(int) != len(ids)  # 2x faster than all(... for t in ids)
        or min(ids) < 0
        or max(ids) >= TOKEN_LIMIT
    ):
        raise _bad(TAG_GENERATE, "prompt_ids must be a non-empty array of ints in [0, 2**31)")
    params = _dc_params(o[3])
    extra_key = o[4] if n > 4 else None
    if extra_key is not None and (type(extra_key) is not str or len(extra_key) > 256):
        raise _bad(TAG_GENERATE, "extra_key must be None or a str of at most 256 characters")
    return DcGenerateRequest(request_id, ids, params, extra_key)


def dc_decode_chunk(data: bytes) -> DcStreamChunk:
    o = _unpack(data, TAG_CHUNK)
    n = len(o)
    if n != 12:
        if n < 3:
            raise _bad(TAG_CHUNK, f"expected an array of at least 3 elements, got {n}")
        o = (o + _CHUNK_DEFAULTS[n:])[:12]
    _, ids, text, cached, finish, prompt_tokens, completion_tokens, miss, lps, prompt_lps = o[:10]
    index, samples_open = o[10:]
    if type(index) is not int or index < 0 or type(samples_open) is not int or samples_open < 0:
        raise _bad(TAG_CHUNK, "index and samples_open must be ints >= 0")
    if type(ids) is not list or list(map(type, ids)).count(int) != len(ids):
        raise _bad(TAG_CHUNK, "token_ids must be an array of ints")
    if type(text) is not str:
        raise _bad(TAG_CHUNK, "text must be a str")
    if type(cached) is not int or cached < 0:
        raise _bad(TAG_CHUNK, "cached_tokens must be an int >= 0")
    if finish is not None and type(finish) is not str:
        raise _bad(TAG_CHUNK, "finish_reason must be None or a str")
    if type(prompt_tokens) is not int or prompt_tokens < 0:
        raise _bad(TAG_CHUNK, "prompt_tokens must be an int >= 0")
    if type(completion_tokens) is not int or completion_tokens < 0:
        raise _bad(TAG_CHUNK, "completion_tokens must be an int >= 0")
    if miss is not None and not _is_str_int_dict(miss):
        raise _bad(TAG_CHUNK, "miss must be None or a map of str to int")
    return DcStreamChunk(
        ids,
        text,
        cached,
        finish,
        prompt_tokens,
        completion_tokens,
        miss,
        _dc_lp_in(lps, "logprobs", False),
        _dc_lp_in(prompt_lps, "prompt_logprobs", True),
        index,
        samples_open,
    )


def _dc_lp_out(lps: list | None) -> list | None:
    if lps is None:
        return None
    return [None if e is None else [e.logprob, e.top_ids, e.top_logprobs] for e in lps]


def _dc_lp_in(v: Any, name: str, nullable: bool) -> list | None:
    """A list of TokenLogprob arrays ``[logprob, top_ids, top_logprobs]`` (entries may be null
    in prompt logprobs), checked as msgspec checks them."""
    if v is None:
        return None
    if type(v) is not list:
        raise _bad(TAG_CHUNK, f"{name} must be None or an array")
    out = []
    for e in v:
        if e is None and nullable:
            out.append(None)
            continue
        if type(e) is not list or not 1 <= len(e) <= 3:
            raise _bad(TAG_CHUNK, f"{name} entries must be arrays of 1 to 3 elements")
        e = e + [[], []][len(e) - 1 :]
        lp, ids, vals = e
        if type(lp) is not float and type(lp) is not int:
            raise _bad(TAG_CHUNK, f"{name}: logprob must be a float")
        if type(ids) is not list or any(type(t) is not int for t in ids):
            raise _bad(TAG_CHUNK, f"{name}: top_ids must be an array of ints")
        if type(vals) is not list or any(type(x) not in (float, int) for x in vals):
            raise _bad(TAG_CHUNK, f"{name}: top_logprobs must be an array of floats")
        out.append(DcTokenLogprob(float(lp), ids, [float(x) for x in vals]))
    return out


def _dc_load(f: Any) -> DcLoadReport:
    if type(f) is not list:
        raise _bad(TAG_POLL, "load must be an array")
    if len(f) != 29:
        f = (f + _LOAD_DEFAULTS[len(f) :])[:29]
    for i in _LOAD_INTS:
        if type(f[i]) is not int:
            raise _bad(TAG_POLL, f"load[{i}] must be an int")
    for i in _LOAD_OPT_FLOATS:
        v = f[i]
        if v is not None and type(v) is not float:
            if type(v) is not int:
                raise _bad(TAG_POLL, f"load[{i}] must be None or a float")
            f[i] = float(v)
    v = f[13]
    if type(v) is not float:
        if type(v) is not int:
            raise _bad(TAG_POLL, "load.hit_rate must be a float")
        f[13] = float(v)
    for i, name in ((10, "prefill_fit_moments"), (25, "decode_fit_moments")):
        m = f[i]
        if type(m) is not tuple:
            if type(m) is not list or len(m) != 5:
                raise _bad(TAG_POLL, f"load.{name} must be an array of 5 floats")
            if not all(type(x) is float for x in m):
                if not all(type(x) is float or type(x) is int for x in m):
                    raise _bad(TAG_POLL, f"load.{name} must be an array of 5 floats")
                m = [float(x) for x in m]
            f[i] = tuple(m)
    r = f[16]
    if type(r) is not tuple:
        if type(r) is not list or list(map(type, r)).count(str) != len(r):
            raise _bad(TAG_POLL, "load.routers must be an array of str")
        f[16] = tuple(r)
    return DcLoadReport(*f)


def _dc_counters(f: Any) -> DcWorkerCounters:
    if type(f) is not list:
        raise _bad(TAG_POLL, "counters must be an array")
    if len(f) != 15:
        f = (f + _COUNTER_DEFAULTS[len(f) :])[:15]
        if f[5] is None:
            f[5] = {}
    for i in _COUNTER_INTS:
        if type(f[i]) is not int:
            raise _bad(TAG_POLL, f"counters[{i}] must be an int")
    if type(f[14]) is not float:
        if type(f[14]) is not int:
            raise _bad(TAG_POLL, "counters.copy_seconds must be a float")
        f[14] = float(f[14])
    if not _is_str_int_dict(f[5]):
        raise _bad(TAG_POLL, "counters.miss_tokens must be a map of str to int")
    return DcWorkerCounters(*f)


def dc_decode_poll(data: bytes) -> DcPollResult:
    o = _unpack(data, TAG_POLL)
    n = len(o)
    if n < 9:
        raise _bad(TAG_POLL, f"expected an array of at least 9 elements, got {n}")
    _, worker_id, epoch, seq, snapshot, events, alive, load, counters = o if n == 9 else o[:9]
    if type(worker_id) is not str or type(epoch) is not str:
        raise _bad(TAG_POLL, "worker_id and epoch must be strs")
    if type(seq) is not int:
        raise _bad(TAG_POLL, "seq must be an int")
    if type(snapshot) is not bool or type(alive) is not bool:
        raise _bad(TAG_POLL, "snapshot and alive must be bools")
    if type(events) is not bytes:
        raise _bad(TAG_POLL, "events must be bytes")
    return DcPollResult(
        worker_id, epoch, seq, snapshot, events, alive, _dc_load(load), _dc_counters(counters)
    )


# ------------------------------------------------------------------------------------------------
# The messages
# ------------------------------------------------------------------------------------------------


def fresh(values: list[int]) -> list[int]:
    """A new list of new int objects with these values (as off a tokenizer or the wire)."""
    return array("q", values).tolist()


@dataclass
class Case:
    name: str
    ms_type: type
    ms_msgs: list  # msgspec Structs
    dc_msgs: list  # the dataclass twins (their own objects)
    dc_encode: Callable[[Any], bytes]
    dc_decode: Callable[[bytes], Any]


def make_generate(rng: random.Random, n_ids: int) -> tuple[GenerateRequest, DcGenerateRequest]:
    ids = [rng.randrange(VOCAB) for _ in range(n_ids)]
    rid = f"cmpl-{rng.getrandbits(128):032x}"
    sp = {
        "max_tokens": 512,
        "temperature": 0.7,
        "top_p": 0.95,
        "top_k": 40,
        "seed": rng.getrandbits(32),
        "stop": ("</s>", "\n\nUser:"),
        "stop_token_ids": tuple(fresh([2, 31999])),
        "ignore_eos": False,
        "presence_penalty": 0.5,
        "repetition_penalty": 1.1,
        "logit_bias": ((rng.randrange(VOCAB), -100.0),),
        "min_tokens": 4,
    }
    ms = GenerateRequest(rid, fresh(ids), SamplingParams(**sp), "tenant-42")
    dc = DcGenerateRequest(rid, fresh(ids), DcSamplingParams(**sp), "tenant-42")
    return ms, dc


def make_chunk(rng: random.Random, final: bool) -> tuple[StreamChunk, DcStreamChunk]:
    tok = [rng.randrange(VOCAB)]
    if not final:
        args = (" the", 1024)
        return StreamChunk(fresh(tok), *args), DcStreamChunk(fresh(tok), *args)
    miss = {"cached": 1024, "cold": 900, "evicted": 64, "page_tail": 16, "in_flight": 44}
    miss["disabled"] = 0
    args = (".", 1024, "stop", 2048, rng.randrange(1, 512))
    return (
        StreamChunk(fresh(tok), *args, dict(miss)),
        DcStreamChunk(fresh(tok), *args, dict(miss)),
    )


def make_poll(rng: random.Random) -> tuple[PollResult, DcPollResult]:
    load = {
        "running": rng.randrange(64),
        "waiting": rng.randrange(16),
        "queued_prefill_tokens": rng.randrange(100_000),
        "active_decode_tokens": rng.randrange(500_000),
        "free_pages": rng.randrange(40_000),
        "total_pages": 40_000,
        "cached_pages": rng.randrange(40_000),
        "evictable_pages": rng.randrange(40_000),
        "prefill_tokens_per_s": rng.uniform(5e3, 5e4),
        "prefill_overhead_s": rng.uniform(1e-3, 1e-2),
        "prefill_fit_moments": tuple(rng.random() * 1e3 for _ in range(5)),
        "decode_step_s": rng.uniform(0.01, 0.05),
        "decode_tokens_per_s": None,
        "hit_rate": rng.random(),
        "preemptions": rng.randrange(10),
        "evicted_pages": rng.randrange(1_000_000),
        "routers": ("router-0", "router-1"),
        "host_total_pages": 80_000,
        "host_free_pages": rng.randrange(80_000),
        "host_cached_pages": rng.randrange(80_000),
        "load_bytes_per_s": rng.uniform(1e9, 5e10),
        "load_overhead_s": None,
        "kv_bytes_per_token": 131072,
        "max_batch_tokens": 8192,
        "decode_seq_s": rng.uniform(1e-4, 1e-3),
        "decode_fit_moments": tuple(rng.random() * 1e3 for _ in range(5)),
        "answer_tokens": rng.uniform(10, 500),
        "state_total_slots": 64,
        "state_free_slots": rng.randrange(64),
    }
    counters = {
        "requests_finished": rng.randrange(10**6),
        "requests_aborted": rng.randrange(1000),
        "prompt_tokens": rng.randrange(10**9),
        "completion_tokens": rng.randrange(10**8),
        "cached_tokens": rng.randrange(10**9),
        "steps": rng.randrange(10**7),
        "prefill_tokens": rng.randrange(10**9),
        "decode_tokens": rng.randrange(10**8),
        "demoted_pages": rng.randrange(10**6),
        "loaded_pages": rng.randrange(10**6),
        "host_evicted_pages": rng.randrange(10**6),
        "bytes_to_host": rng.randrange(10**12),
        "bytes_from_host": rng.randrange(10**12),
        "copy_seconds": rng.uniform(0, 100),
    }
    miss = {
        "cached": 10**8,
        "cold": 10**7,
        "evicted": 10**6,
        "page_tail": 10**5,
        "in_flight": 10**4,
        "disabled": 0,
        "host": 10**3,
        "window": 10**2,
    }
    head = ("worker-3", f"{rng.getrandbits(64):016x}", rng.randrange(10**6), False)
    events = rng.randbytes(4096)
    ms = PollResult(
        *head,
        events,
        True,
        LoadReport(**load),
        WorkerCounters(**counters, miss_tokens=dict(miss)),
    )
    dc = DcPollResult(
        *head,
        events,
        True,
        DcLoadReport(**load),
        DcWorkerCounters(**counters, miss_tokens=dict(miss)),
    )
    return ms, dc


def make_cases(seed: int = 0) -> list[Case]:
    rng = random.Random(seed)
    specs = [
        ("generate 2,048 ids", GenerateRequest, lambda: make_generate(rng, 2048), "generate"),
        ("generate 64 ids", GenerateRequest, lambda: make_generate(rng, 64), "generate"),
        ("chunk (mid-stream)", StreamChunk, lambda: make_chunk(rng, False), "chunk"),
        ("chunk (final, miss)", StreamChunk, lambda: make_chunk(rng, True), "chunk"),
        ("poll result (4 KB events)", PollResult, lambda: make_poll(rng), "poll"),
    ]
    codecs = {
        "generate": (dc_encode_generate, dc_decode_generate),
        "chunk": (dc_encode_chunk, dc_decode_chunk),
        "poll": (dc_encode_poll, dc_decode_poll),
    }
    cases = []
    for name, ms_type, make, kind in specs:
        pairs = [make() for _ in range(POOL)]
        cases.append(
            Case(name, ms_type, [p[0] for p in pairs], [p[1] for p in pairs], *codecs[kind])
        )
    return cases


# ------------------------------------------------------------------------------------------------
# Correctness: same bytes, same round trip, same refusals
# ------------------------------------------------------------------------------------------------


def check_round_trips(case: Case) -> None:
    for ms, dc in zip(case.ms_msgs, case.dc_msgs, strict=True):
        ms_bytes, dc_bytes = encode(ms), case.dc_encode(dc)
        assert decode(ms_bytes, case.ms_type) == ms, f"{case.name}: msgspec round trip"
        assert case.dc_decode(dc_bytes) == dc, f"{case.name}: dataclass round trip"
        assert ms_bytes == dc_bytes, f"{case.name}: the two encoders wrote different bytes"


def _same_decode(data: bytes, ms_type: type, dc_decode: Callable, dc_encode: Callable) -> str:
    """'both accept' (to the same message), 'both refuse', or a description of the mismatch."""
    outcomes = []
    for fn in (lambda: encode(decode(data, ms_type)), lambda: dc_encode(dc_decode(data))):
        try:
            outcomes.append(fn())
        except ProtocolError:
            outcomes.append(None)
    ms, dc = outcomes
    if ms is None and dc is None:
        return "both refuse"
    if ms is not None and dc is not None and ms == dc:
        return "both accept"
    return f"MISMATCH msgspec={'refuses' if ms is None else 'accepts'} dataclass={dc is not None}"


def check_same_validation() -> int:
    """Valid variants and bad messages through both decoders: they must agree on every one."""
    sp = [512, 0.7, 0.95, 40, 7, ["</s>"], [2], False, 0.05, 0.5, -0.5, 1.1, [[3, -100.0]], 2]
    gen = [TAG_GENERATE, "r-1", [1, 2, 3], sp, "k"]
    chunk = [TAG_CHUNK, [5], "x", 3, "stop", 10, 1, {"cold": 7, "cached": 3}]
    load = [
        1,
        0,
        10,
        100,
        5,
        10,
        3,
        2,
        1e4,
        0.002,
        [1.0, 2.0, 3.0, 4.0, 5.0],
        0.02,
        None,
        0.5,
        0,
        9,
    ]
    counters = [1, 0, 10, 5, 3, {"cold": 7}, 8, 10, 5]
    poll = [TAG_POLL, "w", "e", 3, False, b"ev", True, load, counters]

    def with_(msg: list, path: tuple, value: Any) -> list:
        msg = msgspec.msgpack.decode(msgspec.msgpack.encode(msg))  # deep copy
        target = msg
        for i in path[:-1]:
            target = target[i]
        target[path[-1]] = value
        return msg

    accept = [
        (GenerateRequest, gen),
        (GenerateRequest, gen[:4]),  # extra_key left out
        (GenerateRequest, [*gen, "an extra trailing field"]),
        (GenerateRequest, with_(gen, (3,), [])),  # every SamplingParams default
        (GenerateRequest, with_(gen, (3, 1), 1)),  # an int for a float
        (GenerateRequest, with_(gen, (3,), sp[:8])),  # the logits controls left out
        (GenerateRequest, with_(gen, (3,), [*sp, 2, None, ["json_schema", "{}"]])),
        (GenerateRequest, with_(gen, (3, 12), [[9, 1], [3, 2.5]])),  # unsorted, an int bias
        (GenerateRequest, with_(gen, (2,), [0, 2**31 - 1])),
        (StreamChunk, chunk),
        (StreamChunk, chunk[:3]),
        (StreamChunk, with_(chunk, (7,), None)),
        (PollResult, poll),
        (PollResult, with_(with_(poll, (7,), []), (8,), [])),  # every default
        (PollResult, with_(poll, (7, 10, 0), 1)),
        (PollResult, with_(poll, (7,), [*load, ["r0", "r1"]])),  # routers (issue 14)
        (PollResult, [*poll, 1]),
    ]
    refuse = [
        (GenerateRequest, with_(gen, (0,), TAG_CHUNK)),
        (GenerateRequest, with_(gen, (0,), f"generate/{PROTOCOL_VERSION + 1}")),  # a later version
        (GenerateRequest, with_(gen, (0,), "generate/1")),
        (GenerateRequest, gen[:3]),
        (GenerateRequest, with_(gen, (1,), "")),
        (GenerateRequest, with_(gen, (1,), "r" * 257)),
        (GenerateRequest, with_(gen, (1,), 5)),
        (GenerateRequest, with_(gen, (2,), [])),
        (GenerateRequest, with_(gen, (2,), [1, -1])),
        (GenerateRequest, with_(gen, (2,), [1, 2**31])),
        (GenerateRequest, with_(gen, (2,), [1, True])),
        (GenerateRequest, with_(gen, (2,), [1, "2"])),
        (GenerateRequest, with_(gen, (2,), [1, 2.0])),
        (GenerateRequest, with_(gen, (2,), "ids")),
        (GenerateRequest, with_(gen, (3, 0), 0)),
        (GenerateRequest, with_(gen, (3, 0), True)),
        (GenerateRequest, with_(gen, (3, 1), 100.5)),
        (GenerateRequest, with_(gen, (3, 1), "hot")),
        (GenerateRequest, with_(gen, (3, 2), 0.0)),
        (GenerateRequest, with_(gen, (3, 3), 0)),
        (GenerateRequest, with_(gen, (3, 4), 2**63)),
        (GenerateRequest, with_(gen, (3, 5), [""])),
        (GenerateRequest, with_(gen, (3, 5), "</s>")),
        (GenerateRequest, with_(gen, (3, 6), [-1])),
        (GenerateRequest, with_(gen, (3, 7), 1)),
        (GenerateRequest, with_(gen, (3, 8), 1.5)),
        (GenerateRequest, with_(gen, (3, 9), "x")),
        (GenerateRequest, with_(gen, (3, 10), -2.5)),
        (GenerateRequest, with_(gen, (3, 11), 0)),
        (GenerateRequest, with_(gen, (3, 12), [[3, 101.0]])),
        (GenerateRequest, with_(gen, (3, 12), [[3, 1.0], [3, 2.0]])),
        (GenerateRequest, with_(gen, (3, 12), [[-3, 1.0]])),
        (GenerateRequest, with_(gen, (3, 12), [[3]])),
        (GenerateRequest, with_(gen, (3, 13), 513)),
        (GenerateRequest, with_(gen, (3, 13), -1)),
        (GenerateRequest, with_(gen, (3,), [*sp, None, None, None, 1, 1])),  # a field too many
        (GenerateRequest, with_(gen, (3,), [*sp, None, None, None, 0])),  # n below 1
        (GenerateRequest, with_(gen, (3,), [*sp, None, None, None, True])),
        (GenerateRequest, with_(gen, (3,), [*sp, None, None, ["yaml", ""]])),
        (GenerateRequest, with_(gen, (3,), [*sp, None, None, "json"])),
        (GenerateRequest, with_(gen, (3,), [*sp, 21])),  # logprobs over MAX_LOGPROBS
        (GenerateRequest, with_(gen, (3,), [*sp, None, -1])),
        (GenerateRequest, with_(gen, (4,), "k" * 257)),
        (GenerateRequest, with_(gen, (4,), 7)),
        (StreamChunk, with_(chunk, (1,), [True])),
        (StreamChunk, with_(chunk, (2,), b"x")),
        (StreamChunk, with_(chunk, (3,), -1)),
        (StreamChunk, with_(chunk, (4,), 5)),
        (StreamChunk, with_(chunk, (6,), None)),
        (StreamChunk, with_(chunk, (7,), {"cold": 1.5})),
        (StreamChunk, with_(chunk, (7,), {"cold": False})),
        (StreamChunk, chunk[:2]),
        (StreamChunk, [*chunk, [[1.0, ["a"], []]]]),
        (StreamChunk, [*chunk, [None]]),  # a null entry: only prompt logprobs have them
        (StreamChunk, [*chunk, None, None, -1]),  # a negative sample index
        (PollResult, with_(poll, (3,), True)),
        (PollResult, with_(poll, (4,), 0)),
        (PollResult, with_(poll, (5,), "ev")),
        (PollResult, with_(poll, (7, 0), 1.5)),
        (PollResult, with_(poll, (7, 8), "fast")),
        (PollResult, with_(poll, (7, 10), [1.0, 2.0, 3.0, 4.0])),
        (PollResult, with_(poll, (7, 10, 0), None)),
        (PollResult, with_(poll, (8, 5), {"cold": "7"})),
        (PollResult, with_(poll, (8, 6), None)),
        (PollResult, with_(poll, (7,), [*load, [1]])),
        (PollResult, with_(poll, (7,), [*load, "r0"])),
        (PollResult, poll[:8]),
    ]
    dc_codecs = {
        GenerateRequest: (dc_decode_generate, dc_encode_generate),
        StreamChunk: (dc_decode_chunk, dc_encode_chunk),
        PollResult: (dc_decode_poll, dc_encode_poll),
    }
    good = msgpack.packb(gen, use_bin_type=True)
    raw_refuse = [good + b"\x00", good[:-3], b"\xc1", b""]  # trailing, truncated, garbage
    cases = [(t, msgpack.packb(m, use_bin_type=True), "both accept") for t, m in accept]
    cases += [(t, msgpack.packb(m, use_bin_type=True), "both refuse") for t, m in refuse]
    cases += [(GenerateRequest, b, "both refuse") for b in raw_refuse]
    for kind, data, want in cases:
        got = _same_decode(data, kind, *dc_codecs[kind])
        assert got == want, f"{kind.__name__} {msgpack.unpackb(data)!r}: {got}, want {want}"
    return len(cases)


# ------------------------------------------------------------------------------------------------
# Timing
# ------------------------------------------------------------------------------------------------


def _run(fn: Callable, pool: list, reps: int) -> int:
    """ns for ``reps`` passes over ``pool``, one call of ``fn`` per item."""
    t0 = time.perf_counter_ns()
    for _ in repeat(None, reps):
        for x in pool:
            fn(x)
    return time.perf_counter_ns() - t0


def _calibrate(fn: Callable, pool: list, target_s: float) -> int:
    reps = 1
    while True:
        dt = _run(fn, pool, reps)
        if dt >= 20_000_000 or dt >= target_s * 1e9:
            return max(1, round(reps * target_s * 1e9 / dt))
        reps *= 4


def measure(fns: dict[str, tuple[Callable, list]], runs: int, target_s: float) -> dict:
    """Median us per call of each ``name: (fn, pool)``, the runs interleaved (the order rotates
    from run to run), and each one's spread (max - min) / median."""
    reps = {name: _calibrate(fn, pool, target_s) for name, (fn, pool) in fns.items()}
    samples: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(runs):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            fn, pool = fns[name]
            samples[name].append(_run(fn, pool, reps[name]) / (reps[name] * len(pool)) / 1000)
    out = {}
    for name, xs in samples.items():
        med = statistics.median(xs)
        out[name] = (med, (max(xs) - min(xs)) / med)
    return out


def _noop(x: Any) -> Any:
    return x


def bench_case(case: Case, runs: int, target_s: float) -> dict:
    ms_bytes = [encode(m) for m in case.ms_msgs]
    dc_bytes = [case.dc_encode(m) for m in case.dc_msgs]
    t = case.ms_type
    dc_encode, dc_decode = case.dc_encode, case.dc_decode
    gc.collect()
    gc.freeze()
    enc = measure({"ms": (encode, case.ms_msgs), "dc": (dc_encode, case.dc_msgs)}, runs, target_s)
    dec = measure(
        {
            "ms": (partial(decode, kind=t), ms_bytes),  # C-level, so no extra Python frame
            "dc": (dc_decode, dc_bytes),
            # where the time goes: the bare unpack on each side, without types or checks
            "unpackb": (partial(msgpack.unpackb, raw=False), dc_bytes),
            "ms_untyped": (msgspec.msgpack.decode, ms_bytes),
        },
        runs,
        target_s,
    )
    gc.unfreeze()
    return {
        "ms_enc": enc["ms"],
        "dc_enc": enc["dc"],
        "ms_dec": dec["ms"],
        "dc_dec": dec["dc"],
        "unpackb": dec["unpackb"],
        "ms_untyped": dec["ms_untyped"],
        "ms_bytes": statistics.mean(len(b) for b in ms_bytes),
        "dc_bytes": statistics.mean(len(b) for b in dc_bytes),
    }


def _us(x: float) -> str:
    return f"{x:.2f}" if x < 100 else f"{x:.1f}"


def _versions() -> str:
    return (
        f"Python {platform.python_version()} ({platform.python_implementation()}), "
        f"msgspec {msgspec.__version__}, msgpack {'.'.join(map(str, msgpack.version))}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: 3 short runs per figure")
    ap.add_argument("--runs", type=int, default=None, help="runs per figure (default 7)")
    ap.add_argument("--run-s", type=float, default=None, help="seconds per run (default 0.2)")
    args = ap.parse_args()
    runs = args.runs or (3 if args.quick else 7)
    target_s = args.run_s or (0.005 if args.quick else 0.2)

    cases = make_cases()
    for case in cases:
        check_round_trips(case)
    n_checked = check_same_validation()

    title = "Protocol codec: msgspec Structs vs frozen dataclasses + msgpack"
    print(f"# {title}{' (quick)' * args.quick}")
    print()
    print(f"- date: {datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}")
    print(f"- machine: {cpu_model()}, {os.cpu_count()} CPUs, {platform.system()}")
    print(f"- {_versions()}")
    print(
        f"- {runs} runs of ~{target_s:g} s per figure, implementations interleaved; "
        "median us per call"
    )
    print(
        f"- checked first: both round-trip all {POOL * len(cases)} messages, write identical "
        f"bytes, and agree on {n_checked} valid / invalid messages"
    )
    loop = measure({"noop": (_noop, list(range(POOL)))}, runs, target_s)["noop"][0]
    print(f"- the loop + one Python call, included in every figure: {loop * 1000:.0f} ns")
    print()

    results = []
    for case in cases:
        results.append((case.name, bench_case(case, runs, target_s)))

    print(
        "| case | msgspec encode us | msgspec decode us | dataclass+msgpack encode us "
        "| dataclass+msgpack decode us | ratio (dataclass total / msgspec total) "
        "| bytes msgspec | bytes msgpack |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in results:
        ms_total = r["ms_enc"][0] + r["ms_dec"][0]
        dc_total = r["dc_enc"][0] + r["dc_dec"][0]
        print(
            f"| {name} | {_us(r['ms_enc'][0])} | {_us(r['ms_dec'][0])} | {_us(r['dc_enc'][0])} "
            f"| {_us(r['dc_dec'][0])} | {dc_total / ms_total:.1f}x "
            f"| {r['ms_bytes']:,.0f} | {r['dc_bytes']:,.0f} |"
        )
    print()
    print("Where the decode time goes (us per call), and run-to-run noise:")
    print()
    print(
        "| case | msgpack.unpackb alone | dataclass checks + construction "
        "| msgspec untyped decode | msgspec typed decode | max spread of the 4 main figures |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in results:
        spread = max(r[k][1] for k in ("ms_enc", "ms_dec", "dc_enc", "dc_dec"))
        print(
            f"| {name} | {_us(r['unpackb'][0])} | {_us(r['dc_dec'][0] - r['unpackb'][0])} "
            f"| {_us(r['ms_untyped'][0])} | {_us(r['ms_dec'][0])} | {spread:.0%} |"
        )


if __name__ == "__main__":
    main()
