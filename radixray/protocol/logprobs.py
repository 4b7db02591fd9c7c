"""A token's log-probability on the wire (``StreamChunk.logprobs`` and ``prompt_logprobs``)."""

from __future__ import annotations

from msgspec import Struct, field

__all__ = ["MAX_LOGPROBS", "TokenLogprob", "join_logprobs"]

MAX_LOGPROBS = 20  # top alternatives per token (OpenAI's chat range; vLLM's default cap)


class TokenLogprob(Struct, frozen=True, array_like=True):
    """One token's log-probability and its ``top_ids`` alternatives (most likely first) with
    their ``top_logprobs``: the raw model's log-softmax (SamplingParams.logprobs)."""

    logprob: float
    top_ids: list[int] = field(default_factory=list)
    top_logprobs: list[float] = field(default_factory=list)


def join_logprobs(
    a: list[TokenLogprob] | None, b: list[TokenLogprob] | None
) -> list[TokenLogprob] | None:
    """Two chunks' logprobs as one list (None when neither has any)."""
    if a is None and b is None:
        return None
    return (a or []) + (b or [])
