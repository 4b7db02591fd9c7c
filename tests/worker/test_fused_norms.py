"""RMSNorm (with its residual add) and SwiGLU through the Triton kernels (kernels/triton_norm.py,
kernels/triton_act.py) where the model runner fuses them (worker/fused.py): 16-bit models on
CUDA, after a check against PyTorch's; everywhere else the PyTorch path."""

from __future__ import annotations

import pytest
import torch

from radixray.worker import SamplingParams
from radixray.worker.model.layers import MLP, RMSNorm

from .test_engine import engine


def _norms(e) -> list[RMSNorm]:
    return [m for m in e.runner.model.modules() if isinstance(m, RMSNorm)]


def _mlps(e) -> list[MLP]:
    return [m for m in e.runner.model.modules() if isinstance(m, MLP)]


def test_a_cpu_engine_keeps_pytorchs_norms_and_says_why():
    e = engine()
    assert e.runner.fused_norms == "not a 16-bit model on CUDA (cpu, torch.float32)"
    assert _norms(e) and all(m.fused is None and m.fused_add is None for m in _norms(e))
    assert e.runner.fused_act == "not a 16-bit model on CUDA (cpu, torch.float32)"
    assert _mlps(e) and all(m.fused_act is None for m in _mlps(e))
    e = engine(dtype="bfloat16", attention_backend="torch")
    assert e.runner.fused_norms == "not a 16-bit model on CUDA (cpu, torch.bfloat16)"
    assert e.runner.fused_act == "not a 16-bit model on CUDA (cpu, torch.bfloat16)"


@pytest.mark.gpu
def test_bf16_on_cuda_fuses_every_norm_and_activation_and_keeps_the_logits():
    """Every norm, residual add and SwiGLU fused; a prompt's logits within bf16's rounding of
    PyTorch's path (the same seeded tiny model in another engine with them unfused)."""
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    prompt = list(range(3, 60))
    logits = []
    for fused in (True, False):
        e = engine(device="cuda", dtype="bfloat16", debug_checks=False, cuda_graph_max_batch=0)
        assert e.runner.fused_norms is None and all(m.fused is not None for m in _norms(e))
        assert e.runner.fused_act is None and all(m.fused_act is not None for m in _mlps(e))
        if not fused:
            for m in _norms(e):
                m.fused = m.fused_add = None
            for m in _mlps(e):
                m.fused_act = None
        run = e.runner.run
        e.runner.run = lambda b, run=run: logits.append(run(b).clone()) or logits[-1]
        e.generate_batch([prompt], params)
    torch.testing.assert_close(logits[0], logits[1], rtol=0.05, atol=0.05)
