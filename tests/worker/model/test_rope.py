"""RoPE in the six-kernel form (``x * [c, c] + [x2, x1] * [-s, s]``) rounds exactly as the
written-out rotate-half formula does (transformers' ``apply_rotary_pos_emb``), bit for bit."""

from __future__ import annotations

import pytest
import torch

from radixray.worker.model.layers import RotaryEmbedding, apply_rope


def written_out(x, cos, sin):
    """transformers' form: cos / sin of one half, ``x1 cos - x2 sin`` and ``x2 cos + x1 sin``."""
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [16, 64, 128])
def test_apply_rope_equals_the_written_out_formula_bitwise(dtype, head_dim):
    gen = torch.Generator().manual_seed(head_dim)
    rope = RotaryEmbedding(head_dim, 10000.0, 9000, freq_factors=())
    positions = torch.randint(0, 9000, (37,), generator=gen)
    x = (torch.randn(37, 5, head_dim, generator=gen) * 30).to(dtype)
    cos, sin = rope(positions)
    assert cos.shape == sin.shape == (37, 1, head_dim)
    half_cos, half_sin = rope.cos[positions][:, None, :], rope.sin[positions][:, None, :]
    assert torch.equal(apply_rope(x, cos, sin), written_out(x, half_cos, half_sin))


def test_q_and_k_rotated_together_equal_each_alone():
    """The model rotates q's and k's heads as one tensor (one set of kernels)."""
    gen = torch.Generator().manual_seed(0)
    rope = RotaryEmbedding(32, 500000.0, 4096, factor=8.0)
    cos, sin = rope(torch.arange(11))
    q, k = torch.randn(11, 6, 32, generator=gen), torch.randn(11, 2, 32, generator=gen)
    both = apply_rope(torch.cat((q, k), dim=1), cos, sin)
    assert torch.equal(both[:, :6], apply_rope(q, cos, sin))
    assert torch.equal(both[:, 6:], apply_rope(k, cos, sin))
