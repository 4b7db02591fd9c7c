"""Value objects of the worker: a request's mutable state and its completion.

The scheduler and the engine work on ``Request`` (ints and lists). ``SamplingParams`` (from
``radixray.protocol``: the router builds it, the engine runs it) and ``Completion`` are frozen:
they cross the engine's public boundary.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from radixray.protocol import SamplingParams

__all__ = ["Completion", "Request", "RequestStatus"]


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
