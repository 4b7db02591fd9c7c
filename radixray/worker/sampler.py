"""Next-token sampling: greedy, temperature, top-k, top-p, with a per-request seed."""

from __future__ import annotations

import torch

from radixray.protocol import SamplingParams

__all__ = ["Sampler"]

_MIN_TEMPERATURE = 1e-5


class Sampler:
    """Samples one token per row of logits. A request with ``seed`` gets its own generator, so
    its tokens do not depend on what else shares the batch."""

    def __init__(self, seed: int = 0):
        self._default = torch.Generator(device="cpu").manual_seed(seed)
        self._per_request: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        self._per_request.pop(request_id, None)

    def _generator(self, request_id: str, params: SamplingParams) -> torch.Generator:
        if params.seed is None:
            return self._default
        gen = self._per_request.get(request_id)
        if gen is None:
            # manual_seed takes [-2**63, 2**64): fold signed seeds into the unsigned range.
            gen = self._per_request[request_id] = torch.Generator(device="cpu").manual_seed(
                params.seed % (1 << 64)
            )
        return gen

    def sample(
        self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams]
    ) -> list[int]:
        """logits [n, vocab] (any device) -> n token ids."""
        logits = logits.float()
        out = logits.argmax(dim=-1).tolist()
        for i, p in enumerate(params):
            if p.greedy:
                continue
            # Below _MIN_TEMPERATURE the distribution is one-hot in float32 anyway; dividing by
            # a subnormal temperature would overflow the logits to inf and the softmax to NaN.
            row = logits[i].cpu() / max(p.temperature, _MIN_TEMPERATURE)
            if p.top_k > 0 and p.top_k < row.numel():
                kth = torch.topk(row, p.top_k).values[-1]
                row = row.masked_fill(row < kth, float("-inf"))
            probs = torch.softmax(row, dim=-1)
            if p.top_p < 1.0:
                sorted_p, idx = torch.sort(probs, descending=True)
                cum = torch.cumsum(sorted_p, dim=-1)
                # Keep the smallest set whose mass reaches top_p (the first token always stays).
                drop = cum - sorted_p >= p.top_p
                drop[0] = False  # even a top_p that rounds to 0 in float32 keeps the top token
                sorted_p = sorted_p.masked_fill(drop, 0.0)
                probs = torch.zeros_like(probs).scatter_(0, idx, sorted_p)
            gen = self._generator(request_ids[i], p)
            out[i] = int(torch.multinomial(probs, 1, generator=gen).item())
        return out
