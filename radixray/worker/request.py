"""Value objects of the worker: a request's mutable state and its completion.

The scheduler and the engine work on ``Request`` (ints and lists). ``SamplingParams`` (from
``radixray.protocol``: the router builds it, the engine runs it) and ``Completion`` are frozen:
they cross the engine's public boundary. ``CompletionBuilder`` is the one place a
``Completion`` is made: from the request's chunks, as any consumer of the stream sees them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from radixray.protocol import RequestError, SamplingParams, StreamChunk

__all__ = ["Completion", "CompletionBuilder", "Request", "RequestStatus"]


@dataclass(frozen=True)
class Completion:
    request_id: str
    text: str
    token_ids: list[int]
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" | "length" | "abort"
    miss: dict[str, int]  # cause -> prompt tokens (keys: radixray.protocol.MISS_CAUSES)
    index: int = 0  # the sample, of a request's n


class CompletionBuilder:
    """A sink (``engine.Sink``) that gathers one request's chunks into its ``Completion``s, one
    per sample (``SamplingParams.n``).

    A sample's text is its chunks' texts joined (the detokenizer releases every character
    once, the last ones with the sample's last chunk), which also carries the counts and
    ``miss``. ``on_done`` is called once, after the final chunk or the request's error."""

    def __init__(self, request_id: str, on_done: Callable[[], None] | None = None):
        self.request_id = request_id
        self._on_done = on_done
        self._parts: dict[int, tuple[list[str], list[int]]] = {}
        self._ended: list[Completion] = []
        self._error: RequestError | None = None
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    def __call__(self, item: StreamChunk | RequestError) -> None:
        if isinstance(item, RequestError):
            self._error = item
        else:
            texts, tokens = self._parts.setdefault(item.index, ([], []))
            texts.append(item.text)
            tokens += item.token_ids
            if item.ended:
                self._ended.append(
                    Completion(
                        self.request_id,
                        "".join(texts),
                        tokens,
                        item.prompt_tokens,
                        item.cached_tokens,
                        item.completion_tokens,
                        item.finish_reason,
                        dict(item.miss or {}),
                        item.index,
                    )
                )
            if not item.final:
                return
        self._done = True
        if self._on_done is not None:
            self._on_done()

    def results(self) -> list[Completion]:
        """Every sample's completion, by index; raises the request's error if it failed."""
        if self._error is not None:
            raise self._error
        if not self._done:
            raise RuntimeError(f"request {self.request_id!r} has not finished")
        return sorted(self._ended, key=lambda c: c.index)

    def result(self) -> Completion:
        """The completion (of a request with one sample; sample 0's of one with n)."""
        return self.results()[0]


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """A request as the scheduler sees it.

    Page layout while running::

        pages:   [ t0  t1  t2 | p3  p4 ]      t = owned by the radix tree (locked via ``node``)
                   num_tree_pages = 3          p = private to this request
        tokens:  all_tokens[:num_computed] have KV in pages[: ceil(num_computed / P)]
    """

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    block_hashes: list[int]  # of the prompt's full pages
    extra_key: str | None = None
    arrival_step: int = 0
    arrival_work: int = 0  # the scheduler's tokens scheduled before it arrived (its wait's clock)
    arrival_time: float = 0.0
    output_ids: list[int] = field(default_factory=list)
    # Tokens sampled on the device and not yet read back (``overlap.py``: at most the last step's
    # and the one in flight). They count as the request's tokens for the scheduler (positions,
    # pages) but are not in ``output_ids`` until read.
    pending: int = 0
    last_pending: bool = False  # its pending token is its last (by length): schedule no more
    status: RequestStatus = RequestStatus.WAITING
    num_computed: int = 0
    pages: list[int] = field(default_factory=list)
    num_tree_pages: int = 0
    node: object = None  # locked tree node covering pages[:num_tree_pages]
    # Pages below this index had their window-pool pages dropped (out of every future query's
    # window) or left to the cache (docs/window_cache.md); 0 without a window pool.
    window_start: int = 0
    # Its slot of the state pool (models with recurrent-state layers, worker/state_pool.py): held
    # from admission (or its fork) to its release, like its private pages; None otherwise.
    state_slot: int | None = None
    # State checkpoints it took and has not handed to the cache yet: position -> slot (the
    # state after that many tokens; worker/state_checkpointer.py, a state cache only).
    checkpoints: dict[int, int] = field(default_factory=dict)
    miss: dict[str, int] | None = None  # set on first admission
    num_preemptions: int = 0
    deferred_steps: int = 0
    queued_tokens: int = 0  # while waiting: the prefill it adds to the queue (QueuedPrefill)
    finish_reason: str | None = None
    first_token_time: float | None = None
    # Greedy without logits controls (from ``params``, fixed): the sampler takes such rows'
    # argmax without asking their params again each step (``Sampler.sample_requests``).
    plain_greedy: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.plain_greedy = self.params.greedy and not self.params.uses_controls

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def token_ids(self, start: int, end: int) -> list[int]:
        """``all_ids[start:end]`` without building ``all_ids`` (a copy of the whole context per
        request per step: at decode only the last token is needed)."""
        prompt, n = self.prompt_ids, len(self.prompt_ids)
        if end <= n:
            return prompt[start:end]
        if start >= n:
            return self.output_ids[start - n : end - n]
        return prompt[start:] + self.output_ids[: end - n]

    @property
    def num_tokens(self) -> int:
        """Its tokens so far, those sampled on the device and not yet read included."""
        return len(self.prompt_ids) + len(self.output_ids) + self.pending

    @property
    def num_output(self) -> int:
        """Its output tokens so far, those not yet read included."""
        return len(self.output_ids) + self.pending

    def ends_on(self, tok: int, stop_string: bool, eos_ids, max_model_len: int) -> str | None:
        """Why it ends on ``tok``, just read into ``output_ids``: "stop" (a stop string, one of
        its stop tokens, or an EOS it does not ignore), "length" (``max_tokens`` or the model's
        length; a token still on the device is not counted), else None."""
        p = self.params
        if stop_string or tok in p.stop_token_ids or (not p.ignore_eos and tok in eos_ids):
            return "stop"
        out = len(self.output_ids)
        if out >= p.max_tokens or len(self.prompt_ids) + out >= max_model_len:
            return "length"
        return None

    @property
    def num_prompt(self) -> int:
        return len(self.prompt_ids)

    @property
    def needs_prompt_logits(self) -> bool:
        """It wants its prompt's logprobs and has not had them yet: nothing cached serves it."""
        return self.params.prompt_logprobs is not None and not self.output_ids

    @property
    def in_prefill(self) -> bool:
        """True until KV exists for every token but the last (which the next step feeds)."""
        # (num_tokens, inlined: the scheduler asks for every running request every step)
        return self.num_computed < len(self.prompt_ids) + len(self.output_ids) + self.pending - 1

    @property
    def private_pages(self) -> list[int]:
        return self.pages[self.num_tree_pages :]

    @property
    def cached_tokens(self) -> int:
        return self.miss["cached"] + self.miss.get("host", 0) if self.miss else 0
