"""The logits controls of a batch, applied per row on the logits' device before sampling.

In this order (vLLM's semantics for each):

1. ``logit_bias``: each listed token's bias is added to its logit.
2. ``min_tokens``: until a request has generated that many tokens, its stop tokens (the
   ``stop_token_ids``, and the model's EOS tokens unless ``ignore_eos``) get ``-inf``.
3. ``repetition_penalty`` r over prompt + generated tokens: a seen token's logit is divided by
   r if positive and multiplied by r if not (r > 1 discourages repeats).
4. ``frequency_penalty`` f and ``presence_penalty`` p over the generated tokens: a token's
   logit loses ``f * count + p * (count > 0)``.
5. (in the sampler, after the temperature) ``min_p``: tokens whose probability is below
   ``min_p`` times the most likely token's are dropped; then top-k, top-p.

Every control is built only when some row of the batch uses it, from tensors made once per
step: per-row parameter columns and, for the penalties, a (rows, vocab) count of each row's
tokens: the sampler's, kept on the device per request and updated from each step's sampled ids
(``Sampler``), or made here with one ``index_add_`` over all their ids. A batch where no row
uses a control costs one Python check per row and nothing on the device.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

from radixray.protocol import SamplingParams

from .model.upload import upload

__all__ = ["apply_controls", "apply_min_p", "token_counts"]


def token_counts(rows: Sequence[Sequence[int]], vocab: int, device) -> torch.Tensor:
    """[len(rows), vocab] float32: how often each token occurs in each row (one index_add_
    over the flattened ids, no loop over the vocabulary)."""
    counts = torch.zeros(len(rows) * vocab, dtype=torch.float32, device=device)
    lengths = [len(r) for r in rows]
    if sum(lengths):
        flat = upload([t for r in rows for t in r], torch.long, device)
        base = torch.repeat_interleave(
            torch.arange(len(rows), device=device) * vocab,
            upload(lengths, torch.long, device),
        )
        counts.index_add_(0, base + flat, torch.ones_like(flat, dtype=torch.float32))
    return counts.view(len(rows), vocab)


def apply_controls(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    prompt_ids: Sequence[Sequence[int]],
    output_ids: Sequence[Sequence[int]],
    eos_ids: Collection[int] = (),
    counted: tuple[list[int], torch.Tensor, torch.Tensor] | None = None,
    num_output: Sequence[int] | None = None,
) -> torch.Tensor:
    """Steps 1-4 on float logits [n, vocab]; returns ``logits`` itself when no row uses a
    control, else a new tensor (the caller's is never written). ``counted``: the penalized
    rows with their output token counts and prompt tokens seen, kept by the caller (the
    sampler keeps them on the device), instead of counting ``prompt_ids`` and ``output_ids``
    each step; ``num_output``: each row's output length for ``min_tokens`` (tokens not read
    back yet included), instead of ``len(output_ids[i])``."""
    users = [i for i, p in enumerate(params) if p.uses_controls]
    if not users:
        return logits
    logits = logits.clone()
    n, vocab = logits.shape
    dev = logits.device

    bias = [(i, t, b) for i in users for t, b in params[i].logit_bias]
    if bias:
        rows, cols, vals = zip(*bias, strict=True)
        logits.index_put_(
            (upload(rows, torch.long, dev), upload(cols, torch.long, dev)),
            upload(vals, logits.dtype, dev),
            accumulate=True,
        )

    banned = []
    for i in users:
        p = params[i]
        if (num_output[i] if num_output is not None else len(output_ids[i])) < p.min_tokens:
            stops = set(p.stop_token_ids) if p.ignore_eos else set(p.stop_token_ids) | set(eos_ids)
            banned += [(i, t) for t in stops if t < vocab]
    if banned:
        rows, cols = zip(*banned, strict=True)
        idx = (upload(rows, torch.long, dev), upload(cols, torch.long, dev))
        logits.index_put_(idx, upload(float("-inf"), logits.dtype, dev))

    if counted is not None:
        pen, counts, seen = counted
        logits[pen] = _penalize(logits[pen], [params[i] for i in pen], counts, seen)
    elif pen := [i for i in users if params[i].penalized]:
        vocab, dev = logits.shape[1], logits.device
        counts = token_counts([output_ids[i] for i in pen], vocab, dev)
        seen = token_counts([prompt_ids[i] for i in pen], vocab, dev) > 0
        logits[pen] = _penalize(logits[pen], [params[i] for i in pen], counts, seen)
    return logits


def _penalize(
    logits: torch.Tensor,
    params: list[SamplingParams],
    counts: torch.Tensor,
    prompt_seen: torch.Tensor,
) -> torch.Tensor:
    """Steps 3-4 on the rows that use a penalty (``logits``, ``counts`` of each row's output
    tokens and ``prompt_seen`` hold only those rows)."""
    dev = logits.device

    def column(name: str) -> torch.Tensor:
        values = [getattr(p, name) for p in params]
        return upload(values, logits.dtype, dev).unsqueeze(1)

    generated = counts > 0
    if any(p.repetition_penalty != 1.0 for p in params):
        seen = generated | prompt_seen
        # Kept inside float32's normal range: a penalty that rounds to 0 or inf would turn a
        # -inf or a zero logit into NaN.
        info = torch.finfo(logits.dtype)
        r = column("repetition_penalty").clamp(info.tiny, info.max)
        r = torch.where(seen, r, 1.0)
        logits = torch.where(logits > 0, logits / r, logits * r)
    if any(p.frequency_penalty for p in params):
        logits = logits - column("frequency_penalty") * counts
    if any(p.presence_penalty for p in params):
        logits = logits - column("presence_penalty") * generated
    return logits


def apply_min_p(
    logits: torch.Tensor, params: Sequence[SamplingParams], min_temperature: float
) -> torch.Tensor:
    """Step 5 for the sampled rows that set ``min_p``: the dropped tokens' logits become -inf
    (on the logits before the temperature, which the sampler then divides). Returns
    ``logits`` itself when no row uses it."""
    rows = [i for i, p in enumerate(params) if p.min_p > 0 and not p.greedy]
    if not rows:
        return logits
    dev = logits.device
    temps = [max(params[i].temperature, min_temperature) for i in rows]
    mins = [params[i].min_p for i in rows]
    sub = logits[rows] / upload(temps, logits.dtype, dev).unsqueeze(1)
    sub = sub.clamp(max=torch.finfo(sub.dtype).max)  # +inf (a tiny repetition_penalty): NaN
    probs = torch.softmax(sub, dim=-1)
    floor = probs.max(dim=-1, keepdim=True).values * upload(mins, logits.dtype, dev).unsqueeze(1)
    logits = logits.clone()
    logits[rows] = logits[rows].masked_fill(probs < floor, float("-inf"))
    return logits
