"""The oneDNN-packed linear layer: same values as F.linear, weights recoverable exactly, and a
row's result independent of the other rows in the batch (what keeps reuse exact)."""

import pytest
import torch
import torch.nn.functional as F

from radixray.worker.model import load_model
from radixray.worker.model.linear import Linear, can_pack, pack_linears

needs_onednn = pytest.mark.skipif(
    not can_pack(torch.empty(1)), reason="this torch build has no oneDNN linear"
)


def layer(out_features=96, in_features=64, dtype=torch.float32, seed=0) -> Linear:
    g = torch.Generator().manual_seed(seed)
    m = Linear(in_features, out_features)
    m.weight = torch.nn.Parameter(
        torch.randn(out_features, in_features, generator=g).to(dtype), requires_grad=False
    )
    return m


@needs_onednn
def test_packed_matches_f_linear_and_keeps_the_weight():
    m = layer()
    plain = m.weight.clone()
    assert m.pack() and m.packed and m.weight.shape == plain.shape
    assert torch.equal(m.dense_weight(), plain)
    x = torch.randn(13, 64, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(m(x), F.linear(x, plain), rtol=1e-5, atol=1e-5)
    assert m(x[:0]).shape == (0, 96)


@needs_onednn
@pytest.mark.parametrize("rows", [1, 2, 3, 7, 8, 16, 33, 200, 1024])
def test_a_rows_result_does_not_depend_on_the_batch(rows):
    m = layer(out_features=3 * 64 + 5, in_features=160)
    m.pack()
    g = torch.Generator().manual_seed(2)
    probe = torch.randn(1, 160, generator=g)
    alone = m(probe)
    batch = torch.randn(rows, 160, generator=g)
    batch[rows // 2] = probe[0]
    assert torch.equal(m(batch)[rows // 2], alone[0])


def test_other_dtypes_stay_plain():
    m = layer(dtype=torch.float64)
    assert not m.pack() and not m.packed
    x = torch.randn(4, 64, dtype=torch.float64)
    assert torch.equal(m(x), F.linear(x, m.weight))


@needs_onednn
def test_loaded_models_are_packed_and_export_exact_weights():
    loaded = load_model("tiny", seed=3).model
    assert all(m.packed for m in loaded.modules() if isinstance(m, Linear))
    assert pack_linears(loaded) == sum(1 for m in loaded.modules() if isinstance(m, Linear))
    from radixray.worker.model import LlamaModel
    from radixray.worker.model.loader import random_hf_state_dict

    state = random_hf_state_dict(loaded.config, seed=3)
    plain = LlamaModel(loaded.config)
    plain.load_hf_state_dict(state)
    for name, tensor in loaded.hf_state_dict().items():
        assert torch.equal(tensor, plain.hf_state_dict()[name]), name
