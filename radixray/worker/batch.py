"""What one scheduler step computes: its items, and its shape in the timing model's terms."""

from __future__ import annotations

from typing import NamedTuple

from .request import Request

__all__ = ["Batch", "ScheduledItem", "StepShape"]


class ScheduledItem(NamedTuple):
    req: Request
    start: int  # first position computed this step
    num_tokens: int  # tokens computed this step
    sample: bool  # the chunk reaches the end: sample the next token from its last position

    @property
    def decode(self) -> bool:
        """One token of a request that has output already: a decode, not a prefill chunk."""
        return self.num_tokens == 1 and self.req.num_output > 0


class StepShape(NamedTuple):
    """What a step computes, in the terms of the simulator's timing model
    (``radixray.sim.timing.TimingModel.step_time``)."""

    decode_batch: int  # sequences decoding one token
    decode_ctx: int  # the context those tokens attend to, summed
    prefill_tokens: int  # prompt tokens computed (chunks of prefills)
    prefill_ctx_sum: int  # the context each prefill token attends to, summed


class Batch(NamedTuple):
    items: list[ScheduledItem]

    @property
    def num_tokens(self) -> int:
        return sum(it.num_tokens for it in self.items)

    def shape(self) -> StepShape:
        decode = decode_ctx = prefill = ctx_sum = 0
        for it in self.items:
            c, pos = it.num_tokens, it.start
            if it.decode:
                decode += 1
                decode_ctx += pos + 1
            else:  # a prefill chunk: token j attends to pos + j + 1 positions
                prefill += c
                ctx_sum += c * pos + c * (c - 1) // 2
        return StepShape(decode, decode_ctx, prefill, ctx_sum)
