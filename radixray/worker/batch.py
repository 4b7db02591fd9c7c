"""What one scheduler step computes: its items, and its shape in the timing model's terms."""

from __future__ import annotations

from typing import NamedTuple

from .request import Request

__all__ = ["Batch", "DecodeRows", "ScheduledItem", "StepShape", "decode_rows"]


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


class DecodeRows(NamedTuple):
    """A decode step's inputs, a row per item (``Batch.decode_rows``)."""

    ids: list[int]  # each row's input token (0 for one on the device: ``on_device``)
    positions: list[int]
    slots: list[int]  # where each row's KV goes: page * page_size + offset
    pages: list[list[int]]  # each row's pages up to its position (unpadded)
    width: int  # the longest row of ``pages``
    on_device: list[int]  # rows whose token the last step sampled and the host has not read


class Batch(NamedTuple):
    items: list[ScheduledItem]
    # State copies to run before the forward, in order (``state_checkpointer.StateCopy``: a
    # checkpoint restored into a request's slot, or a request's state saved to one).
    state_copies: tuple | list = ()

    @property
    def num_tokens(self) -> int:
        return sum([it.num_tokens for it in self.items])

    def decode_rows(self, page_size: int) -> DecodeRows:
        """The inputs of a step whose items are each one token (a decode step), in one pass."""
        return decode_rows(self.items, page_size)

    def shape(self) -> StepShape:
        decode = decode_ctx = prefill = ctx_sum = 0
        for it in self.items:
            c, pos, req = it.num_tokens, it.start, it.req
            if c == 1 and (req.output_ids or req.pending):  # it.decode, inlined (every step)
                decode += 1
                decode_ctx += pos + 1
            else:  # a prefill chunk: token j attends to pos + j + 1 positions
                prefill += c
                ctx_sum += c * pos + c * (c - 1) // 2
        return StepShape(decode, decode_ctx, prefill, ctx_sum)


def decode_rows(items, page_size: int, sampled: bool = False) -> DecodeRows | None:
    """The rows of a decode step's ``items`` (each one token), in one pass: what the graph
    replay (``Batch.decode_rows``) and the eager decode's one host tensor (``decode_inputs.py``)
    are built from. ``sampled``: None unless each item is one token that samples (the caller
    learns here whether the step is a decode step, without a pass of its own)."""
    ids, pos, slots, pages, on_device = [], [], [], [], []
    width = 1
    for i, it in enumerate(items):
        if sampled and (it.num_tokens != 1 or not it.sample):
            return None
        req, p = it.req, it.start
        n = len(req.prompt_ids)
        if p < n:
            ids.append(req.prompt_ids[p])
        elif p - n < len(req.output_ids):
            ids.append(req.output_ids[p - n])
        else:  # the token the last step sampled, still on the device (Request.pending)
            ids.append(0)
            on_device.append(i)
        k = p // page_size + 1
        row = req.pages[:k]
        pos.append(p)
        slots.append(row[-1] * page_size + p % page_size)
        pages.append(row)
        if k > width:
            width = k
    return DecodeRows(ids, pos, slots, pages, width, on_device)
