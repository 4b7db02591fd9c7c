"""A step's sampled tokens into their requests: each token's text, whether it ends its request,
its chunk (``Engine._emit`` serially, ``OverlapStepper._read`` one step later).

Nearly every token of a decode step is the common one: a request past its first token, no
grammar, no logprobs, not its last. Such a request is *steady* (``Live.steady``: its stop ids
and its length limit, fixed from its params once its first token is out), and ``take_all``
handles its token in one loop over the batch: append it, detokenize, test the two fixed
bounds, build the chunk. Anything else (a first token, logprobs, a grammar, an end) goes
through ``take``, the general path, so the chunks, ends and freed pages are the same.

Why one loop: on the CPU a decode step's host work runs with cold caches after the forward, and
each Python call on the per-request path costs ~0.3-1 us there (three calls a token before:
``take``, ``Request.ends_on``, ``LiveRequests.token``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixray.protocol import StreamChunk

from .live import Live

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["settle", "take", "take_all"]


def take_all(
    engine: Engine, lives: list[Live], tokens: list[int], lps, now: float, starts=None
) -> list[StreamChunk]:
    """Each of ``lives``' sampled token (``lps``: its logprobs or None) into its request; their
    chunks, in order. ``starts`` (``Launched.rows_of`` and rows, overlapped): where a step
    already launched began computing each request, given back if the request ends here."""
    out = []
    for live, tok, lp in zip(lives, tokens, lps, strict=True):
        steady = live.steady
        if steady is not None:
            req, detok = live.req, live.detok
            ids = req.output_ids
            ids.append(tok)
            text = detok.update(ids)
            if tok not in steady[0] and len(ids) < steady[1] and not detok.stopped:
                chunk = StreamChunk(
                    [tok], text, live.cached, None, 0, 0, None, None, None, live.index
                )
                if live.sink is not None:
                    live.sink(chunk)
                out.append(chunk)
                continue
            reason = req.ends_on(tok, detok.stopped, engine._stop_ids, engine.max_model_len)
            out.append(_end(engine, live, tok, text, reason, lp, _start(starts, req)))
        else:
            out.append(take(engine, live, tok, lp, now, _start(starts, live.req)))
    return out


def take(engine: Engine, live: Live, tok: int, lp, now: float, computed: int | None = None):
    """A sampled token into its request: its chunk, and the request's end if it ends (the
    general path). ``computed``: where a step already launched began computing it
    (``overlap.py``): an end gives that step's work back."""
    req = live.req
    req.output_ids.append(tok)
    if req.first_token_time is None:
        req.first_token_time = now
        if live.index == 0:  # a request's TTFT is its first sample's
            engine.meter.record_first_token(req.num_prompt, req.cached_tokens, now - live.queued_at)
    delta = live.detok.update(req.output_ids)
    reason = req.ends_on(tok, live.detok.stopped, engine._stop_ids, engine.max_model_len)
    if live.matcher is not None:
        reason = engine.structured.advance(live.matcher, req.request_id, tok, reason)
    chunk = _end(engine, live, tok, delta, reason, lp, computed)
    if reason is None and live.steady is None:
        settle(live, engine._stop_ids, engine.max_model_len)
    return chunk


def _end(engine: Engine, live: Live, tok: int, text: str, reason, lp, computed) -> StreamChunk:
    """``tok``'s chunk; with a ``reason``, the request finished first (its last text). The
    last text can still complete a stop string (a SentencePiece run of byte pieces comes out
    only when it ends): then the request ends on it, "stop", whatever else ended it."""
    if reason:
        req = live.req
        text += live.detok.flush(req.output_ids)
        if live.detok.stopped:
            reason = "stop"
        if computed is not None:
            req.num_computed = computed
        engine.scheduler.finish(req, reason)
    return engine._live.token(live, tok, text, reason, lp)


def settle(live: Live, eos_ids, max_model_len: int) -> None:
    """Make ``live`` steady (``take_all``'s loop) once its first token is out and its chunks
    can only be the common one or an end: no grammar, no logprobs of any kind. Its stop ids
    (its own, and the model's unless it ignores EOS) and its output limit (``max_tokens``, the
    model's length less its prompt) are ``Request.ends_on``'s bounds, fixed by its params."""
    req = live.req
    p = req.params
    if req.first_token_time is None or live.cached is None or live.matcher is not None:
        return
    if p.logprobs is not None or p.prompt_logprobs is not None:
        return
    stops = frozenset(p.stop_token_ids) | (frozenset() if p.ignore_eos else frozenset(eos_ids))
    live.steady = (stops, min(p.max_tokens, max_model_len - req.num_prompt))


def _start(starts, req) -> int | None:
    """Where the launched step ``starts`` (its rows by request, its items) began ``req``."""
    if starts is None:
        return None
    row = starts[0].get(id(req))
    return None if row is None else starts[1][row].start
