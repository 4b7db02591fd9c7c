"""What the recurrent-state layers read in one step: which state slot each sequence of the flat
batch owns, and how its rows are run (attention.py is the same for the KV pages).

A state layer keeps one fixed-size state per sequence (state_layers.py), in a slot of the state
pool (worker/state_pool.py). Rows split two ways::

    sequences   A: 5 cached + 3 new   B: decode (9 cached + 1 new)   C: 4 new (cold)
    rows        [a5 a6 a7 | b9 | c0 c1 c2 c3]
    slots        A -> 2, B -> 0, C -> 5
    prefills    (0, 3, slot 2, has_initial)   (4, 8, slot 5, fresh)      one call per sequence
    decode      rows [3], slots [0]                                      one batched update

A sequence whose context before the step is empty starts from zero state, whatever its slot
holds: a slot is never cleared, and stale contents are never read. Any other sequence must find
in its slot the state after exactly its cached tokens (the last step's chunk, or a checkpoint
the cache copied in). Every state layer writes the state after the step's last row back into
the same slot: prefill chunks carry it across chunk boundaries, decode updates it in place.

A prefill span may also carry *saves*: state checkpoints taken inside it (the state cache's,
worker/state_checkpointer.py), each an offset within the span and a destination slot. Every
state layer writes its state after that many of the span's rows into the destination (the conv
its last ``K - 1`` inputs there, the scan split at the offset), so a long prompt runs in one
step instead of one step per checkpoint::

    span (0, 600, slot 2, fresh), saves ((256, 7), (512, 9)):   slot 7 <- state after 256 rows,
                                                                slot 9 <- after 512, slot 2 <- 600
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch

from radixray.kernels.state_cpu import SlotRun, slot_runs

from .upload import upload

__all__ = ["SeqSpan", "StateBatch", "StateMetadata", "StateTensors"]


class SeqSpan(NamedTuple):
    """One sequence run as a chunk: rows ``start:end`` of the batch, its slot, and whether its
    slot holds its state (False: a sequence with no context before this step)."""

    start: int
    end: int
    slot: int
    has_initial: bool
    # (offset within the span, slot): the state after ``offset`` rows goes to ``slot`` too;
    # offsets increasing, each in (0, end - start)
    saves: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class StateMetadata:
    """Built by the model runner once per step (host lists; two small device tensors).

    - ``prefills``: sequences run one at a time as a chunk (more than one new token, or no
      context before the step), in batch order;
    - ``decode_rows`` int64 ``[Bd]``: the rows of one-token continuations, run as one batch;
    - ``decode_slots`` int64 ``[Bd]``: their slots, in the same order;
    - ``decode_runs``: the same slots as runs of consecutive ids (host ints), for the CPU path
      that updates the pool's slots in place as views (kernels/state_cpu.py).
    """

    prefills: tuple[SeqSpan, ...]
    decode_rows: torch.Tensor
    decode_slots: torch.Tensor
    decode_runs: tuple[SlotRun, ...] = ()

    def __post_init__(self) -> None:
        covered = sum(run.count for run in self.decode_runs)
        if covered != self.num_decode:
            raise ValueError(
                f"decode_runs must cover the {self.num_decode} decode slots, covers {covered} "
                "(StateMetadata.build makes them with slot_runs)"
            )

    @property
    def num_decode(self) -> int:
        return int(self.decode_rows.shape[0])

    @classmethod
    def build(
        cls,
        slots: Sequence[int],
        num_cached: Sequence[int],
        num_new: Sequence[int],
        device: torch.device | str = "cpu",
        saves: Sequence[Sequence[tuple[int, int]]] | None = None,
    ) -> StateMetadata:
        """From one entry per sequence, in the batch's order (AttentionMetadata.build's).
        Slots must be distinct: two sequences of a step never share a state. ``saves``: per
        sequence, the checkpoints to save inside its span, (tokens, slot): its state after
        ``tokens`` of its tokens (``num_cached < tokens < num_cached + num_new``, increasing)
        into ``slot``, a slot no sequence of the step owns."""
        if saves is None:
            saves = [()] * len(slots)
        if not (len(slots) == len(num_cached) == len(num_new) == len(saves)):
            raise ValueError(
                f"slots, num_cached, num_new and saves need one entry per sequence, got "
                f"{len(slots)}, {len(num_cached)}, {len(num_new)}, {len(saves)}"
            )
        if len(set(slots)) != len(slots) or any(s < 0 for s in slots):
            raise ValueError(f"state slots must be distinct and >= 0, got {list(slots)}")
        _check_saves(slots, num_cached, num_new, saves)
        prefills, rows, decode_slots, row = [], [], [], 0
        for slot, cached, new, at in zip(slots, num_cached, num_new, saves, strict=True):
            if new < 0 or cached < 0:
                raise ValueError(f"num_cached and num_new must be >= 0, got {cached}, {new}")
            if new == 1 and cached > 0:
                rows.append(row)
                decode_slots.append(slot)
            elif new > 0:
                offs = tuple((t - cached, dst) for t, dst in at)
                prefills.append(SeqSpan(row, row + new, slot, cached > 0, offs))
            row += new
        return cls(
            tuple(prefills),
            upload(rows, torch.int64, device),
            upload(decode_slots, torch.int64, device),
            slot_runs(decode_slots),
        )


def _check_saves(slots, num_cached, num_new, saves) -> None:
    """Each sequence's saves strictly inside its span, increasing, into distinct slots that no
    sequence of the step owns (a save must not overwrite a state the step reads)."""
    dsts = [dst for at in saves for _, dst in at]
    if len(set(dsts)) != len(dsts) or set(dsts) & set(slots) or any(d < 0 for d in dsts):
        raise ValueError(
            f"saves need distinct slots >= 0 that no sequence owns, got {dsts} (owned: "
            f"{list(slots)})"
        )
    for cached, new, at in zip(num_cached, num_new, saves, strict=True):
        points = [t for t, _ in at]
        if points != sorted(set(points)) or any(not cached < t < cached + new for t in points):
            raise ValueError(
                f"saves must be increasing token counts in ({cached}, {cached + new}) (strictly "
                f"inside the span of a sequence with {cached} cached and {new} new), got {points}"
            )


class StateTensors(Protocol):
    """The state pool as the model sees it: per state layer, every slot's state, written in
    place. ``conv_state(i)`` ``[num_slots, channels, kernel - 1]`` for conv and mamba layers;
    ``ssm_state(i)`` ``[num_slots, heads, head_dim, state_size]`` for mamba layers."""

    def conv_state(self, layer: int) -> torch.Tensor: ...

    def ssm_state(self, layer: int) -> torch.Tensor: ...


class StateBatch(NamedTuple):
    """A step's state inputs: the slots (``meta``) and the pool they index (``pool``)."""

    meta: StateMetadata
    pool: StateTensors
