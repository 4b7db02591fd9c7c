"""The checks of ``SamplingParams``: run on construction and on decode, so a params object that
exists is valid. Each failure is an ``InvalidRequest`` naming the field and what it must be."""

from __future__ import annotations

import math

import msgspec

from .errors import InvalidRequest
from .logprobs import MAX_LOGPROBS

__all__ = ["MAX_SAMPLES", "check_sampling_params"]

MAX_SAMPLES = 128  # n: OpenAI's limit


def check_sampling_params(p) -> None:
    """Raise ``InvalidRequest`` for the first field of ``p`` out of its range; normalise the
    containers (``stop``, ``stop_token_ids``, ``logit_bias``) to sorted tuples in place.

    It runs for every request the router takes (and again where a worker decodes it): a request
    whose every field is of its exact type, in range and with no container to normalise
    (``_usual``: one straight-line test) is done at once, the others go through the checks field
    by field (``_check_each``), which raise or normalise as they always did."""
    bias = p.logit_bias
    if not bias and (type(bias) is tuple or type(bias) is dict) and _usual(p):
        if type(bias) is dict:  # the edge's empty {}: the tuple the checks would make
            msgspec.structs.force_setattr(p, "logit_bias", ())
        return
    _check_each(p)


def _usual(p) -> bool:
    """True when ``_check_each`` would pass ``p`` (``logit_bias`` aside) and change nothing: each
    number of its exact type (never a bool) and in range, the logits controls off, ``stop`` and
    ``stop_token_ids`` tuples of valid items. False says only "check field by field"."""
    m, t, top_p, k, seed, stop, ids = (
        p.max_tokens, p.temperature, p.top_p, p.top_k, p.seed, p.stop, p.stop_token_ids
    )  # fmt: skip
    return (
        type(m) is int and m >= 1
        and (type(t) is float or type(t) is int) and 0.0 <= t <= 100.0
        and (type(top_p) is float or type(top_p) is int) and 0.0 < top_p <= 1.0
        and type(k) is int and (k == -1 or k >= 1)
        and (seed is None or type(seed) is int and -(2**63) <= seed < 2**63)
        and type(stop) is tuple and (not stop or all(type(s) is str and s for s in stop))
        and type(ids) is tuple and (not ids or all(type(i) is int and i >= 0 for i in ids))
        and type(p.min_p) is float and p.min_p == 0.0
        and type(p.presence_penalty) is float and p.presence_penalty == 0.0
        and type(p.frequency_penalty) is float and p.frequency_penalty == 0.0
        and type(p.repetition_penalty) is float and p.repetition_penalty == 1.0
        and type(p.min_tokens) is int and 0 <= p.min_tokens <= m
        and (p.logprobs is None or type(p.logprobs) is int and 0 <= p.logprobs <= MAX_LOGPROBS)
        and (p.prompt_logprobs is None
             or type(p.prompt_logprobs) is int and 0 <= p.prompt_logprobs <= MAX_LOGPROBS)
        and type(p.n) is int and 1 <= p.n <= MAX_SAMPLES
    )  # fmt: skip


def _check_each(p) -> None:
    """``check_sampling_params``' checks, field by field in its order: the first bad one
    raises."""

    def bad(name: str, want: str):
        raise InvalidRequest(
            f"SamplingParams.{name} must be {want}, got {getattr(p, name)!r}", name
        )

    if isinstance(p.max_tokens, bool) or not isinstance(p.max_tokens, int):
        bad("max_tokens", "an int >= 1")
    if p.max_tokens < 1:
        bad("max_tokens", "an int >= 1")
    for name, lo, hi, want in (
        ("temperature", 0.0, 100.0, "a number in [0, 100]"),
        ("top_p", 0.0, 1.0, "a number in (0, 1]"),
    ):
        v = getattr(p, name)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            bad(name, want)
        if not (lo <= v <= hi) or (name == "top_p" and v == 0.0):
            bad(name, want)
    if isinstance(p.top_k, bool) or not isinstance(p.top_k, int):
        bad("top_k", "-1 (off) or an int >= 1")
    if p.top_k == 0 or p.top_k < -1:
        bad("top_k", "-1 (off) or an int >= 1")
    if p.seed is not None and (
        isinstance(p.seed, bool) or not isinstance(p.seed, int) or not -(2**63) <= p.seed < 2**63
    ):
        bad("seed", "None or an int in the 64-bit signed range")
    stop = p.stop
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, tuple):
        stop = tuple(stop)
    if stop is not p.stop:
        msgspec.structs.force_setattr(p, "stop", stop)
    if any(not isinstance(s, str) or not s for s in stop):
        bad("stop", "a list of non-empty strings")
    if not isinstance(p.stop_token_ids, tuple):
        msgspec.structs.force_setattr(p, "stop_token_ids", tuple(p.stop_token_ids))
    if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in p.stop_token_ids):
        bad("stop_token_ids", "a list of token ids >= 0")
    _check_controls(p, bad)
    n = p.n
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SAMPLES:
        bad("n", f"an int in [1, {MAX_SAMPLES}]")


def _check_controls(p, bad) -> None:
    for name, lo, hi, want in (
        ("min_p", 0.0, 1.0, "a number in [0, 1]"),
        ("presence_penalty", -2.0, 2.0, "a number in [-2, 2]"),
        ("frequency_penalty", -2.0, 2.0, "a number in [-2, 2]"),
        ("repetition_penalty", 0.0, math.inf, "a finite number > 0"),
    ):
        v = getattr(p, name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (lo <= v <= hi):
            bad(name, want)
        if name == "repetition_penalty" and not 0.0 < v < math.inf:
            bad(name, want)
    bias = p.logit_bias
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
        msgspec.structs.force_setattr(p, "logit_bias", pairs)
    m = p.min_tokens
    if isinstance(m, bool) or not isinstance(m, int) or m < 0:
        bad("min_tokens", "an int >= 0")
    if m > p.max_tokens:
        bad("min_tokens", f"at most max_tokens ({p.max_tokens})")
    for name in ("logprobs", "prompt_logprobs"):
        v = getattr(p, name)
        if v is not None and (type(v) is not int or not 0 <= v <= MAX_LOGPROBS):
            bad(name, f"None or an int in [0, {MAX_LOGPROBS}]")
