"""The requests an engine serves, from admission to their last chunk: each sample's state (its
scheduler ``Request``, its text so far, its grammar), where its chunks go, and how it ends.

Keyed by the engine's id of each sample: a request's own id for it (or its sample 0), and
``<id>#<i>`` for sample i of a request with ``n`` > 1 (``samples.py``), which share one sink
and one ``SampleGroup``. Only the engine's driving thread touches it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from radixray.protocol import RequestError, StreamChunk

from .detokenizer import IncrementalDetokenizer
from .logprobs import with_logprobs
from .request import Request
from .samples import SampleGroup, follower, unforked_ends

__all__ = ["Live", "LiveRequests", "Sink"]

# Where a request's chunks go as they are produced (on the stepping thread); a failed request
# gets its RequestError instead of a final chunk.
Sink = Callable[[StreamChunk | RequestError], None]


@dataclass(eq=False)
class Live:
    """A sample the engine is serving: its scheduler state, its text so far, where it goes."""

    req: Request
    detok: IncrementalDetokenizer
    sink: Sink | None = None
    admitted: bool = False
    matcher: object = None  # structured output: a grammar.GrammarMatcher, or None
    queued_at: float = field(default_factory=time.monotonic)  # when the engine took it
    prompt_logprobs: list = field(default_factory=list)  # until its first token (logprobs.py)
    index: int = 0  # which of its request's samples (samples.py)
    cached: int | None = None  # its request's cached_tokens, read at its first chunk (fixed)
    group: SampleGroup | None = None  # its request's samples, when it has n > 1
    # (stop ids, output limit) once its tokens can take emit.take_all's common path, else None
    steady: tuple[frozenset[int], int] | None = None


class LiveRequests:
    """The engine's table of live samples and their requests' groups. ``end`` builds and sends a
    sample's chunk, and at a sample's end forgets it and counts it (``meter``)."""

    def __init__(self, meter, sampler):
        self.meter = meter  # stats.EngineStats
        self.sampler = sampler  # forgets a finished sample's generator
        self._by_id: dict[str, Live] = {}
        self.groups: dict[str, SampleGroup] = {}  # requests with n > 1, by request id
        self.ruled = 0  # samples under a grammar (none: a step skips the grammar's work)
        self.prompt_lps = 0  # samples asking for prompt logprobs (none: overlap.serial_reason)
        self.lps = 0  # samples asking for their tokens' logprobs (none: a step skips them)

    def __contains__(self, rid: str) -> bool:
        return rid in self._by_id or rid in self.groups

    def __getitem__(self, rid: str) -> Live:
        return self._by_id[rid]

    def of(self, reqs: list[Request]) -> list[Live]:
        """Each request's live sample (one call a step, not one a request)."""
        by_id = self._by_id
        return [by_id[r.request_id] for r in reqs]

    def get(self, rid: str) -> Live | None:
        return self._by_id.get(rid)

    def find(self, reqs: list[Request]) -> list[Live | None]:
        """Each request's live sample, or None where its id is not live (one call a step)."""
        get = self._by_id.get
        return [get(r.request_id) for r in reqs]

    def values(self) -> list[Live]:
        return list(self._by_id.values())

    def add(self, live: Live) -> None:
        """A new request (a group for its samples when ``n`` > 1), or a request's fork."""
        req = live.req
        self._by_id[req.request_id] = live
        self.ruled += live.matcher is not None
        self.prompt_lps += req.params.prompt_logprobs is not None
        self.lps += req.params.logprobs is not None
        if live.group is not None:
            live.group.ids.append(req.request_id)
        elif req.params.n > 1:
            group = SampleGroup(req.request_id, req.params.n, req.params.n, ids=[req.request_id])
            live.group = self.groups[req.request_id] = group

    def fork(self, live: Live, detokenizer, matcher) -> list[Request]:
        """The other samples of ``live``'s request, made live, when ``live`` is its leader
        sampling its first token (``samples.py``), else none. Each gets its own text
        (``detokenizer(request)``) and grammar (``matcher(spec)``), and the leader's sink,
        queue time and prompt logprobs."""
        group = live.group
        if group is None or group.forked or live.index != 0:
            return []
        group.forked = True
        out = []
        for i in range(1, group.n):
            f = follower(live.req, i)
            fl = Live(f, detokenizer(f), live.sink, True, matcher(f.params.grammar), index=i)
            fl.group, fl.queued_at = group, live.queued_at
            fl.prompt_logprobs = list(live.prompt_logprobs)
            self.add(fl)
            out.append(f)
        return out

    def samples(self, request_id: str) -> list[Live]:
        """The live samples of request ``request_id`` (none if it is not here)."""
        group = self.groups.get(request_id)
        ids = group.ids if group is not None else [request_id]
        return [self._by_id[i] for i in ids if i in self._by_id]

    def clear(self) -> Iterator[tuple[str, Live]]:
        """Forget everything (an engine failure); yields each live sample as it goes."""
        self.groups.clear()
        self.ruled = self.prompt_lps = self.lps = 0
        while self._by_id:
            rid = next(iter(self._by_id))
            yield rid, self._by_id.pop(rid)

    def token(self, live: Live, tok: int, text: str, reason: str | None, lp) -> StreamChunk:
        """A sampled token's chunk: ``end`` with its logprobs (``with_logprobs``), the common
        one (not the last, no logprobs) built here at once (every token of every request)."""
        req, cached = live.req, live.cached
        if reason is None and lp is None and req.params.prompt_logprobs is None:
            if cached is None:  # (set at admission, before any token, and never again)
                cached = live.cached = req.cached_tokens
            chunk = StreamChunk([tok], text, cached, None, 0, 0, None, None, None, live.index)
            if live.sink is not None:
                live.sink(chunk)
            return chunk
        return self.end(live, [tok], text, reason, *with_logprobs(live, lp))

    def end(
        self, live: Live, toks: list[int], text: str, reason: str | None, *lp: list | None
    ) -> StreamChunk:
        """Send ``live``'s chunk of ``toks`` (``text``); with a ``reason`` its last, with the
        usage. A request aborted before it forked ends its other samples too."""
        req, group = live.req, live.group
        lps, plps = lp or ([] if req.params.logprobs is not None else None, None)  # an abort
        if reason is None:  # (every token's path: kept short)
            chunk = StreamChunk(
                toks, text, req.cached_tokens, None, 0, 0, None, lps, plps, live.index
            )
            if live.sink is not None:
                live.sink(chunk)
            return chunk
        if group is not None:
            group.open -= 1
        chunk = StreamChunk(
            toks,
            text,
            req.cached_tokens,
            reason,
            req.num_prompt,
            len(req.output_ids),
            dict(req.miss) if req.miss else {},
            lps,
            plps,
            live.index,
            group.open if group is not None else 0,
        )
        self.sampler.forget(req.request_id)
        self.meter.record_answer(len(req.output_ids))
        del self._by_id[req.request_id]
        self.ruled -= live.matcher is not None
        self.prompt_lps -= req.params.prompt_logprobs is not None
        self.lps -= req.params.logprobs is not None
        chunks = [chunk]
        if group is not None and not group.forked:  # its other samples never started
            chunks += unforked_ends(group, req, reason)
        if chunks[-1].samples_open == 0:  # the request's end (counted before anyone hears)
            self.meter.requests_finished += 1
            if reason == "abort":
                self.meter.requests_aborted += 1
            if group is not None:
                del self.groups[group.request_id]
        for c in chunks:
            self.send(live, c)
        return chunks[-1]

    @staticmethod
    def send(live: Live, chunk: StreamChunk) -> StreamChunk:
        if live.sink is not None:
            live.sink(chunk)
        return chunk
