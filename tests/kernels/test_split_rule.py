"""The split-KV decode's split count (``triton_decode.num_splits_for``): a pure function of the
batch, the KV heads, the block table's width and the device's resident programs; no GPU."""

from __future__ import annotations

import pytest

triton_decode = pytest.importorskip("radixray.kernels.triton_decode")
num_splits_for = triton_decode.num_splits_for

H100_SMS = 132  # H100 SXM and H200 alike
FILL = triton_decode._PROGRAMS_PER_SM * H100_SMS  # 528
BLOCK_N = 64  # the bf16 head_dim 128 tile (triton_decode._launch_config)


def test_one_long_sequence_fills_a_wave_of_resident_programs():
    # 1 x 32k, Hkv 8: the cap (64 splits, 512 programs), where 2 programs an SM gave 33 (264)
    assert num_splits_for(1, 8, 32768, BLOCK_N, FILL) == 64
    assert num_splits_for(1, 8, 32768, BLOCK_N, 2 * H100_SMS) == 33
    # 1 x 4k: two 64-token chunks a split bound it (32 splits, 256 programs)
    assert num_splits_for(1, 8, 4096, BLOCK_N, FILL) == 32
    # in a CUDA graph the width (max_model_len) bounds it, not the length on the device: a 4k
    # sequence in a 32k-wide graph gets the 32k count
    assert num_splits_for(1, 8, 32768, BLOCK_N, FILL) == 64


def test_more_sequences_take_fewer_splits_and_a_full_batch_one():
    got = {b: num_splits_for(b, 8, 32768, BLOCK_N, FILL) for b in (2, 4, 16, 33, 64, 256)}
    assert got == {2: 33, 4: 16, 16: 4, 33: 2, 64: 1, 256: 1}
    for b, n in got.items():  # within one wave, and a split more would pass it
        assert b * 8 * n <= FILL or n == 1
        assert n == 64 or b * 8 * (n + 1) > FILL


def test_short_contexts_and_small_devices():
    assert num_splits_for(1, 8, 100, BLOCK_N, FILL) == 1  # under two chunks: no split
    assert num_splits_for(1, 8, 129, BLOCK_N, FILL) == 2
    assert num_splits_for(0, 8, 32768, BLOCK_N, FILL) == 64  # an empty batch: any valid count
    assert num_splits_for(1, 2, 1 << 20, BLOCK_N, FILL) == 64  # the cap (Hkv 2 leaves SMs idle)
    assert num_splits_for(1, 8, 32768, BLOCK_N, 8) == 1  # the interpreter's 8 programs
