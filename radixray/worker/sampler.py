"""Next-token sampling: the logits controls (``logits_controls``), then greedy or temperature,
min-p, top-k, top-p, with a per-request seed."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

from radixray.protocol import SamplingParams

from .logits_controls import apply_controls, apply_min_p

__all__ = ["Sampler", "apply_token_bitmask"]

_MIN_TEMPERATURE = 1e-5


_BITS = torch.arange(32, dtype=torch.int32)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows=None) -> None:
    """Sets to -inf, in place, every logit whose bit is 0 in ``bitmask`` [m, ceil(vocab/32)]
    (int32 words, bit j of word w allows id 32*w + j: xgrammar's and llguidance's layout).
    ``rows``: the m rows of ``logits`` the mask is for (default all); the others are untouched."""
    vocab = logits.shape[-1]
    bits = bitmask.to(logits.device).unsqueeze(-1) >> _BITS.to(logits.device)
    allowed = (bits & 1).bool().flatten(1)[:, :vocab]
    if rows is None:
        logits.masked_fill_(~allowed, float("-inf"))
        masked = logits
    else:
        idx = torch.as_tensor(rows, device=logits.device)
        masked = logits[idx].masked_fill(~allowed, float("-inf"))
    # A row the controls and the grammar together leave empty (min_tokens holds back the stop
    # token that is all the grammar allows): the grammar wins, uniform over what it allows.
    empty = torch.isneginf(masked).all(dim=-1)
    if empty.any():
        masked[empty] = torch.zeros_like(masked[empty]).masked_fill(~allowed[empty], float("-inf"))
    if rows is not None:
        logits[idx] = masked


class Sampler:
    """Samples one token per row of logits. A request with ``seed`` gets its own generator, so
    its tokens do not depend on what else shares the batch. ``eos_ids``: the model's stop
    tokens, which ``min_tokens`` holds back (with each request's ``stop_token_ids``)."""

    def __init__(self, seed: int = 0, eos_ids: Collection[int] = ()):
        self.eos_ids = frozenset(eos_ids)
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
        self,
        logits: torch.Tensor,
        request_ids: list[str],
        params: list[SamplingParams],
        prompt_ids: Sequence[Sequence[int]] | None = None,
        output_ids: Sequence[Sequence[int]] | None = None,
        grammar_mask: tuple[list[int], torch.Tensor] | None = None,
    ) -> list[int]:
        """logits [n, vocab] (any device) -> n token ids. ``prompt_ids`` and ``output_ids``
        (each row's tokens so far) are needed only by the penalties and ``min_tokens``.
        ``grammar_mask``: (rows, bitmask) of the rows under a grammar, applied after the
        controls."""
        return self.sample_ids(
            logits, request_ids, params, prompt_ids, output_ids, grammar_mask
        ).tolist()

    def sample_ids(
        self,
        logits: torch.Tensor,
        request_ids: list[str],
        params: list[SamplingParams],
        prompt_ids: Sequence[Sequence[int]] | None = None,
        output_ids: Sequence[Sequence[int]] | None = None,
        grammar_mask: tuple[list[int], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``sample``'s ids as an int64 tensor on the logits' device: a greedy batch never
        waits for the device (its ids stay there, ``overlap.py``); a sampled row is drawn on
        the host, with its request's generator, and written back."""
        given, logits = logits, logits.float()
        if any(p.uses_controls for p in params):
            if prompt_ids is None or output_ids is None:
                empty = [()] * len(params)
                prompt_ids = empty if prompt_ids is None else prompt_ids
                output_ids = empty if output_ids is None else output_ids
            logits = apply_controls(logits, params, prompt_ids, output_ids, self.eos_ids)
            logits = apply_min_p(logits, params, _MIN_TEMPERATURE)
        if grammar_mask is not None:  # after the controls: see apply_token_bitmask
            if logits is given:  # no copy was made: leave the caller's tensor alone
                logits = logits.clone()
            apply_token_bitmask(logits, grammar_mask[1], grammar_mask[0])
        out = logits.argmax(dim=-1)
        for i, p in enumerate(params):
            if p.greedy:
                continue
            # Below _MIN_TEMPERATURE the distribution is one-hot in float32 anyway; dividing by
            # a subnormal temperature would overflow the logits to inf and the softmax to NaN.
            row = logits[i].cpu() / max(p.temperature, _MIN_TEMPERATURE)
            if p.uses_controls:
                # A tiny repetition_penalty can push a logit to +inf (softmax: NaN): cap it.
                row = row.clamp(max=torch.finfo(row.dtype).max)
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
