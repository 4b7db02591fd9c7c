"""Value objects of the worker: sampling parameters, a request's mutable state, its completion.

The scheduler and the engine work on ``Request`` (ints and lists). ``SamplingParams`` and
``Completion`` are frozen: they cross the engine's public boundary.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = ["SamplingParams", "Completion", "Request", "RequestStatus", "MISS_CAUSES"]

# Why a prompt token was or was not reused; they add up to the prompt length.
#   cached     reused from the prefix cache
#   cold       never seen by this worker
#   evicted    this worker held it once (ghost list) and evicted it
#   page_tail  the unaligned tail, or the page holding the last prompt token (logits need it)
#   in_flight  another running request was computing it at the same time
#   disabled   the cache is a ChunkCache (reuse off)
MISS_CAUSES = ("cached", "cold", "evicted", "page_tail", "in_flight", "disabled")


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self):
        def bad(name: str, want: str):
            raise ValueError(f"SamplingParams.{name} must be {want}, got {getattr(self, name)!r}")

        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            bad("max_tokens", "an int >= 1")
        if self.max_tokens < 1:
            bad("max_tokens", "an int >= 1")
        if not (0.0 <= float(self.temperature) <= 100.0):
            bad("temperature", "a number in [0, 100]")
        if not (0.0 < float(self.top_p) <= 1.0):
            bad("top_p", "a number in (0, 1]")
        if not isinstance(self.top_k, int) or self.top_k == 0 or self.top_k < -1:
            bad("top_k", "-1 (off) or an int >= 1")
        if self.seed is not None and (
            isinstance(self.seed, bool)
            or not isinstance(self.seed, int)
            or not -(2**63) <= self.seed < 2**63
        ):
            bad("seed", "None or an int in the 64-bit signed range")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        if any(not isinstance(s, str) or not s for s in self.stop):
            bad("stop", "a list of non-empty strings")
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            bad("stop_token_ids", "a list of token ids >= 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


@dataclass(frozen=True)
class Completion:
    request_id: str
    text: str
    token_ids: list[int]
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" | "length" | "abort"
    miss: dict[str, int]  # cause -> prompt tokens (keys: MISS_CAUSES)


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
    arrival_time: float = 0.0
    output_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed: int = 0
    pages: list[int] = field(default_factory=list)
    num_tree_pages: int = 0
    node: object = None  # locked tree node covering pages[:num_tree_pages]
    miss: dict[str, int] | None = None  # set on first admission
    num_preemptions: int = 0
    deferred_steps: int = 0
    finish_reason: str | None = None
    first_token_time: float | None = None

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_prompt(self) -> int:
        return len(self.prompt_ids)

    @property
    def in_prefill(self) -> bool:
        """True until KV exists for every token but the last (which the next step feeds)."""
        return self.num_computed < self.num_tokens - 1

    @property
    def private_pages(self) -> list[int]:
        return self.pages[self.num_tree_pages :]

    @property
    def cached_tokens(self) -> int:
        return self.miss["cached"] if self.miss else 0
