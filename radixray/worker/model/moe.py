"""A sparse mixture of experts (Qwen3-MoE's block): a router picks ``top_k`` of ``E`` SwiGLU
experts per token and the block returns their outputs weighted by the router's probabilities.

Batched per expert, not per token: the ``T * top_k`` (token, expert) choices are sorted by expert
once, and each expert that got any runs one matmul pair over all its tokens::

    probs = softmax(gate(h))            [T, E]   (float32)
    w, chosen = topk(probs, k)          [T, k]   (w / w.sum() when norm_topk_prob)
    order = argsort(chosen.flat)        choices grouped by expert, tokens ascending in each group
    for e with n_e > 0:                 out[tokens_e] += w_e * expert_e(h[tokens_e])

The loop is over experts (at most ``E`` iterations a layer), and each token's sum over its experts
runs in expert order whatever else is in the batch, as transformers' own loop does.

With ``moe_shared_mlp`` (Granite) a dense MLP of ``intermediate_size`` runs beside the experts
on every token and its output is added to theirs.
"""

from __future__ import annotations

import torch
from torch import nn

from radixray.model_meta.model_config import ModelConfig

from .layers import MLP
from .linear import Linear

__all__ = ["SparseMoE"]


class SparseMoE(nn.Module):
    def __init__(self, cfg: ModelConfig, device=None) -> None:
        super().__init__()
        self.num_experts, self.top_k = cfg.num_experts, cfg.num_experts_per_tok
        self.norm_topk_prob = cfg.norm_topk_prob
        self.gate = Linear(cfg.hidden_size, cfg.num_experts, device)
        self.experts = nn.ModuleList(
            MLP(cfg.hidden_size, cfg.moe_intermediate_size, device) for _ in range(cfg.num_experts)
        )
        self.shared = (
            MLP(cfg.hidden_size, cfg.intermediate_size, device) if cfg.moe_shared_mlp else None
        )

    def route(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's experts and their weights: ``chosen`` int64 ``[T, k]``, ``weights``
        ``[T, k]`` in ``h``'s dtype."""
        probs = torch.softmax(self.gate(h).float(), dim=-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return chosen, weights.to(h.dtype)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        chosen, weights = self.route(h)
        flat = chosen.reshape(-1)
        order = flat.argsort(stable=True)  # (token, expert) choices grouped by expert
        tokens = order // self.top_k
        weights = weights.reshape(-1)[order, None]
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        out = torch.zeros_like(h)
        start = 0
        for expert, n in zip(self.experts, counts, strict=True):
            if n:
                rows = tokens[start : start + n]
                # index_put_ with accumulate, not index_add_: the same sums (an expert's rows
                # are distinct tokens), but CPU index_add_ on 2 threads took ~90 ms a call on a
                # shared host (index_put_: ~5 us), most of a Granite-H test engine's steps
                y = expert(h[rows]) * weights[start : start + n]
                out.index_put_((rows,), y, accumulate=True)
                start += n
        return out if self.shared is None else out + self.shared(h)
