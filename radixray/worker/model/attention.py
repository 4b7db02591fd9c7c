"""The per-step attention metadata the model reads: where each new token's K/V goes, and which
pages hold each sequence's context.

One step runs one flat batch of ``T`` new tokens from ``B`` sequences, prefill chunks and decode
tokens mixed. Sequence ``b`` owns rows ``cu_seqlens_q[b] : cu_seqlens_q[b + 1]`` of the batch;
after the step its context is ``seq_lens[b]`` tokens long, so its new token ``j`` sits at position
``seq_lens[b] - q_len_b + j``::

    sequences   A: 5 cached + 3 new      B: decode (9 cached + 1 new)     C: 4 new (cold)
    rows        [a5 a6 a7 | b9 | c0 c1 c2 c3]             T = 8
    cu_seqlens_q  [0, 3, 4, 8]        seq_lens [8, 10, 4]
    slot_mapping  row i -> page * P + offset of its position in that sequence's block_table row
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .upload import upload

__all__ = ["AttentionMetadata", "WindowKV"]


@dataclass(frozen=True)
class AttentionMetadata:
    """Tensors on the model's device; built by the model runner once per step.

    - ``slot_mapping`` int64 ``[T]``: ``page * page_size + offset`` that receives each new token's
      K/V (``-1`` skips the row, e.g. padding).
    - ``block_table`` int32 ``[B, max_pages]``: page ids of each sequence in order; entries past
      a sequence's last page are ignored (any value, 0 by convention).
    - ``cu_seqlens_q`` int32 ``[B + 1]``: row offsets of each sequence's new tokens.
    - ``seq_lens`` int32 ``[B]``: context length after this step (cached + new).
    - ``max_seqlen_q``: the most new tokens of any sequence, as a host int (None = unknown). The
      GPU backends size their grid from it without a device sync, and 1 (a pure decode step)
      takes the split-KV decode kernel.
    """

    slot_mapping: torch.Tensor
    block_table: torch.Tensor
    cu_seqlens_q: torch.Tensor
    seq_lens: torch.Tensor
    max_seqlen_q: int | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])

    def last_token_indices(self) -> torch.Tensor:
        """Row of each sequence's last new token: the rows that need logits for sampling."""
        return self.cu_seqlens_q[1:].long() - 1

    @classmethod
    def build(
        cls,
        page_tables: Sequence[Sequence[int]],
        num_cached: Sequence[int],
        num_new: Sequence[int],
        page_size: int,
        device: torch.device | str = "cpu",
    ) -> tuple[AttentionMetadata, torch.Tensor]:
        """Metadata and ``positions [T]`` from plain lists, one entry per sequence.

        ``page_tables[b]`` must cover ``num_cached[b] + num_new[b]`` tokens. A convenience for
        tests and simple loops; the engine's model runner may build the tensors its own way.
        """
        if not (len(page_tables) == len(num_cached) == len(num_new)):
            raise ValueError(
                f"page_tables, num_cached and num_new need one entry per sequence, got "
                f"{len(page_tables)}, {len(num_cached)}, {len(num_new)}"
            )
        slots: list[int] = []
        positions: list[int] = []
        cu = [0]
        for b, (pages, cached, new) in enumerate(
            zip(page_tables, num_cached, num_new, strict=True)
        ):
            end = cached + new
            if new < 0 or cached < 0 or len(pages) * page_size < end:
                raise ValueError(
                    f"sequence {b}: {len(pages)} pages of {page_size} cannot hold {cached} cached "
                    f"+ {new} new tokens"
                )
            for pos in range(cached, end):
                positions.append(pos)
                slots.append(pages[pos // page_size] * page_size + pos % page_size)
            cu.append(cu[-1] + new)
        width = max((len(p) for p in page_tables), default=0)
        table = [list(p) + [0] * (width - len(p)) for p in page_tables]
        meta = cls(
            slot_mapping=upload(slots, torch.int64, device),
            block_table=upload(table, torch.int32, device).reshape(len(page_tables), width),
            cu_seqlens_q=upload(cu, torch.int32, device),
            seq_lens=torch.tensor(
                [c + n for c, n in zip(num_cached, num_new, strict=True)],
                dtype=torch.int32,
                device=device,
            ),
            max_seqlen_q=max(num_new, default=0),
        )
        return meta, upload(positions, torch.int64, device)


class WindowKV(NamedTuple):
    """The sliding-window layers' own pool and the step's metadata for it (docs/window_cache.md).

    ``attn`` has the same rows, sequences and lengths as the step's metadata; its
    ``slot_mapping`` and ``block_table`` are window-pool page ids (a dropped page reads the NULL
    page, out of every query's window). ``layer_slots[i]`` is ``(in_window_pool, index)``: where
    layer ``i``'s K/V live, in ``k_cache``/``v_cache`` here or in the main pool's.
    """

    attn: AttentionMetadata
    k_cache: torch.Tensor  # [window layers, window pages, P, Hkv, D]
    v_cache: torch.Tensor
    layer_slots: Sequence[tuple[bool, int]]
