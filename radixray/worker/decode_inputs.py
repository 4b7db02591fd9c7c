"""A decode step's inputs, built on the host as one list and sent to the device in one copy.

A decode step (every item one sampled token) needs, per row: the input id, its position, the
KV slot it writes, its context length, and its block-table row (its pages up to that position).
All of it goes into one int32 host tensor (pinned on CUDA), laid out as::

    [ ids (m) | positions (m) | slots (m) | seq_lens (m) | block table (m x w) ]

    m: rows; w: the longest row's pages (shorter rows padded with page 0, never read)

which reaches the device in one non-blocking copy (it never waits for the step in flight). The
step's tensors are views of that copy; ids, positions and slots are widened to int64 there in one
device op (the model indexes with them). Every value fits int32: ids are below the vocabulary,
positions below the model's length, slots below the pool's tokens (checked at construction).

Why one list and one tensor: on the CPU the forward between two steps evicts the host's caches,
so each library call of the next step's host work costs ~10-40 us cold (a numpy gather from
block-table rows kept between steps measured slower than this, for that reason); a request's row
is a slice of its own page list, which the page manager only appends to while it decodes. The
list becomes a tensor through a Python ``array`` of C ints (``torch.frombuffer``): a third of
``torch.tensor``'s time for the same list.
"""

from __future__ import annotations

from array import array
from typing import NamedTuple

import torch

from .batch import decode_rows
from .model.attention import AttentionMetadata

__all__ = ["DecodeInputs", "DecodeStep"]

_INT32_MAX = 2**31 - 1


class DecodeStep(NamedTuple):
    """A decode step's tensors (views of one copy on the device) and its rows on the device."""

    ids: torch.Tensor  # int64 [m] (0 in the rows of ``on_device``)
    positions: torch.Tensor  # int64 [m]
    meta: AttentionMetadata
    every: torch.Tensor  # int64 [m]: 0 .. m - 1, each row's logits
    on_device: list[int]  # rows whose token the last step sampled and the host has not read


class DecodeInputs:
    """Builds decode steps' inputs for a pool of ``num_pages`` pages of ``page_size`` tokens on
    ``device``."""

    def __init__(self, page_size: int, num_pages: int, device: torch.device):
        if num_pages * page_size > _INT32_MAX:
            raise ValueError(
                f"num_pages * page_size = {num_pages * page_size} KV slots: decode inputs hold "
                f"slots as int32, so the pool must have at most {_INT32_MAX}"
            )
        self.P = page_size
        self.device = device
        self._pin = device.type == "cuda"
        self._ranges: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # m -> (cu_seqlens, every)

    def build(self, items) -> DecodeStep | None:
        """The inputs of ``items`` (``ScheduledItem``: its request and start), or None unless
        each is one token that samples (a decode step)."""
        if not items:
            return None
        got = decode_rows(items, self.P, sampled=True)
        if got is None:
            return None
        ids, pos, slots, rows, w, on_device = got
        m = len(ids)
        flat = ids + pos + slots
        flat += [p + 1 for p in pos]  # seq_lens
        zeros = [0] * w
        for r in rows:
            flat += r
            if len(r) < w:
                flat += zeros[len(r) :]
        host = torch.frombuffer(array("i", flat), dtype=torch.int32)
        dev = host.pin_memory().to(self.device, non_blocking=True) if self._pin else host
        vec, lens, table = dev.split((3 * m, m, m * w))  # (each torch call counts, see above)
        ids_t, pos_t, slots_t = vec.view(3, m).long().unbind()
        cu, every = self._range(m)
        meta = AttentionMetadata(
            slot_mapping=slots_t,
            block_table=table.view(m, w),
            cu_seqlens_q=cu,
            seq_lens=lens,
            max_seqlen_q=1,
        )
        return DecodeStep(ids_t, pos_t, meta, every, on_device)

    def rows(self, m: int) -> torch.Tensor:
        """0 .. m - 1 (int64, on the device): an ``m``-row step's rows (made once per size)."""
        return self._range(m)[1]

    def _range(self, m: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``cu_seqlens_q`` (0 .. m, int32) and each row's logits index (0 .. m - 1, int64) of
        an ``m``-row decode step: made once per size (steps only read them)."""
        got = self._ranges.get(m)
        if got is None:
            cu = torch.arange(m + 1, dtype=torch.int32, device=self.device)
            got = self._ranges[m] = (cu, cu[:m].long())
        return got
