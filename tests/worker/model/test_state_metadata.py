"""StateMetadata (worker/model/state_metadata.py): how a step's sequences split into prefill
spans and decode rows, and the decode slots as runs of consecutive ids for the CPU path."""

from __future__ import annotations

import pytest
import torch

from radixray.kernels.state_cpu import SlotRun
from radixray.worker.model.state_metadata import SeqSpan, StateMetadata


def test_build_splits_prefills_from_decodes_and_cuts_the_decode_slots_into_runs():
    # slots 4 (prefill, warm), 2, 3 (decodes), 7 (cold, one token: a prefill), 0 (decode)
    meta = StateMetadata.build([4, 2, 3, 7, 0], [5, 9, 1, 0, 3], [3, 1, 1, 1, 1])
    assert meta.prefills == (SeqSpan(0, 3, 4, True), SeqSpan(5, 6, 7, False))
    assert meta.decode_rows.tolist() == [3, 4, 6]
    assert meta.decode_slots.tolist() == [2, 3, 0]
    assert meta.decode_runs == (SlotRun(0, 2, 2), SlotRun(2, 0, 1))


def test_runs_that_do_not_cover_the_decode_slots_are_refused():
    rows = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="decode_runs must cover the 2 decode slots, covers 1"):
        StateMetadata((), rows, rows, (SlotRun(0, 0, 1),))
