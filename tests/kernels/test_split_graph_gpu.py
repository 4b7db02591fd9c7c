"""Split-KV decode replayed from a CUDA graph whose block table is wider than the contexts, as the
engine's decode graphs run it (worker/cuda_graph.py: the table as wide as max_model_len, the split
count chosen from that width, the lengths only on the device). Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from radixray.kernels import reference
from tests.kernels.cases import assert_close, make_paged_kv, make_query

pytestmark = pytest.mark.gpu
BF16 = torch.bfloat16


def test_decode_replayed_from_a_32k_wide_graph_matches_the_reference():
    from radixray.kernels.triton_decode import choose_num_splits, paged_decode_attention

    gen = torch.Generator().manual_seed(3)
    kv = make_paged_kv([4096, 100], 16, 8, 128, BF16, "cuda", gen)
    # the graph's static table: 32k tokens wide, each row's pages first, page 0 past them
    table = torch.zeros(2, 32768 // 16, dtype=torch.int32, device="cuda")
    table[:, : kv.block_table.shape[1]] = kv.block_table.clamp(min=0)
    lens = kv.seq_lens.clone()
    q = make_query(2, 32, 128, BF16, "cuda", gen)
    scale = 128**-0.5
    assert choose_num_splits(2, 8, 32768, 64, q.device) > 16  # mostly empty for the short row

    def run():
        return paged_decode_attention(q, kv.k_cache, kv.v_cache, table, lens, scale)

    side = torch.cuda.Stream()  # warm-up off the capture (compiles), as DecodeGraphs does
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for new_lens in ([4096, 100], [4001, 17]):  # the lengths change on the device only
        lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        graph.replay()
        want = reference.paged_decode_attention(
            q, kv.k_cache, kv.v_cache, kv.block_table, lens, scale
        )
        assert_close(out, want, BF16)
