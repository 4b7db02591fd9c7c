"""A request's ``n`` samples (``SamplingParams.n``): one prefill, then ``n`` sequences.

The request is scheduled as one (its leader, sample 0) until its prompt is computed. In the
step that samples the leader's first token the engine forks it: samples 1 .. n-1 share the
prompt's cached pages (locked, as any request holds a cached prefix), each gets a copy of the
partial last page (the one it will write next; with reuse off, of every page), and each draws
its first token from the leader's logits row in the same step. From there every sample is a
request of its own: decoded, preempted and finished on its own. So all ``n`` first tokens come
with the prompt's one prefill; a peer that fans ``n`` out as ``n`` requests (vLLM, SGLang)
computes each sample's partial page again, a step later, or with reuse off its whole prompt.

A fork that finds no room (``max_running``, memory) queues the sample at the front instead: it
is admitted as any request, matching the leader's cached pages. Sample ``i`` is seeded
``seed + i`` (vLLM's rule), so samples differ and a seeded request repeats.

All samples stream on the request's one sink, each chunk with its ``index``; ``samples_open``
counts the samples still generating, and the chunk that ends the last one ends the stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from radixray.protocol import StreamChunk

from .request import Request

__all__ = ["SampleGroup", "expand_mask", "follower", "unforked_ends"]

_SEED_SPAN = 1 << 64
_SEED_MIN = -(1 << 63)


@dataclass(eq=False)
class SampleGroup:
    """The samples of one request with ``n`` > 1, while any is running."""

    request_id: str  # the request's (its leader's) id
    n: int
    open: int  # samples not ended yet
    forked: bool = False
    ids: list[str] = field(default_factory=list)  # the engine's ids of its samples, leader first


def follower(leader: Request, i: int) -> Request:
    """Sample ``i`` of ``leader``'s request: the same prompt (its pages come from the fork),
    seeded ``seed + i`` (wrapped into the 64-bit range), its prompt attributed as the leader's
    (the prompt was admitted once)."""
    p = leader.params
    seed = None if p.seed is None else (p.seed + i - _SEED_MIN) % _SEED_SPAN + _SEED_MIN
    return Request(
        request_id=f"{leader.request_id}#{i}",
        prompt_ids=leader.prompt_ids,
        params=p.replace(n=1, seed=seed),
        block_hashes=leader.block_hashes,
        extra_key=leader.extra_key,
        arrival_time=leader.arrival_time,
        miss=dict(leader.miss) if leader.miss is not None else None,
    )


def unforked_ends(group: SampleGroup, leader: Request, reason: str) -> list[StreamChunk]:
    """The last chunks of the samples a request ended with before it forked (an abort while
    its prompt was computed): no tokens, the prompt's usage, ``samples_open`` counting down."""
    miss = dict(leader.miss) if leader.miss else {}
    lps = [] if leader.params.logprobs is not None else None
    out = []
    for i in range(1, group.n):
        group.open -= 1
        out.append(
            StreamChunk(
                [], "", leader.cached_tokens, reason, leader.num_prompt, 0, miss, lps, None, i,
                group.open,
            )
        )  # fmt: skip
    return out


def expand_mask(mask: tuple[list[int], torch.Tensor] | None, rows: list[int], first_new: int):
    """The grammar mask of a step whose sampled rows grew by forks: ``rows[k]`` is the logits
    row that sampled row ``k`` reads (forks past ``first_new`` read their leader's), and a fork
    starts in its leader's grammar state, so it takes the leader's mask row."""
    if mask is None or len(rows) == first_new:
        return mask
    masked, bitmask = mask
    where = {r: j for j, r in enumerate(masked)}
    extra = [(k, where[rows[k]]) for k in range(first_new, len(rows)) if rows[k] in where]
    if not extra:
        return mask
    picks = torch.tensor([j for _, j in extra], device=bitmask.device)
    return masked + [k for k, _ in extra], torch.cat([bitmask, bitmask[picks]])
