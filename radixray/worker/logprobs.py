"""Log-probabilities of sampled and prompt tokens, from the raw logits (before temperature and
every logits control: vLLM's default), batched: one log-softmax and one top-k over the rows that
ask, on the device, and one copy to the host; nothing when no row asks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from radixray.protocol import TokenLogprob

__all__ = ["keep_prompt_logprobs", "token_logprobs", "with_logprobs"]


def token_logprobs(
    logits: torch.Tensor, counts: Sequence[int | None], tokens: Sequence[int]
) -> list[TokenLogprob | None]:
    """Each row's ``tokens[i]`` log-probability and its ``counts[i]`` most likely alternatives
    (None for a row whose count is None)."""
    out: list[TokenLogprob | None] = [None] * len(counts)
    rows = [i for i, k in enumerate(counts) if k is not None]
    if not rows:
        return out
    dev = logits.device
    idx = torch.tensor(rows, device=dev)
    lp = torch.log_softmax(logits.index_select(0, idx).float(), dim=-1)
    chosen = lp.gather(1, torch.tensor([tokens[i] for i in rows], device=dev)[:, None])[:, 0]
    k = max(counts[i] for i in rows)
    if k:
        top = torch.topk(lp, min(k, lp.shape[-1]), dim=-1)
        top_vals, top_ids = top.values.tolist(), top.indices.tolist()
    chosen = chosen.tolist()
    for j, i in enumerate(rows):
        n = counts[i]
        if n:
            out[i] = TokenLogprob(chosen[j], top_ids[j][:n], top_vals[j][:n])
        else:
            out[i] = TokenLogprob(chosen[j])
    return out


def keep_prompt_logprobs(prompt_logits: list, live: Mapping) -> None:
    """A step's prompt logits (``ModelRunner.prompt_logits``: request, first position, rows)
    as logprobs, kept on each request's ``_Live`` until its first token's chunk. Entry q is
    prompt token q + 1's; a chunk recomputed after a preemption replaces what it covers."""
    for req, start, rows in prompt_logits:
        state = live.get(req.request_id)
        if state is None:
            continue
        n = rows.shape[0]
        tokens = req.prompt_ids[start + 1 : start + 1 + n]
        del state.prompt_logprobs[start:]
        state.prompt_logprobs += token_logprobs(rows, [req.params.prompt_logprobs] * n, tokens)


def with_logprobs(state, lp: TokenLogprob | None) -> tuple:
    """A sampled token's chunk's ``(logprobs, prompt_logprobs)``: the prompt's (the first
    token's None) go with the request's first token."""
    req = state.req
    prompt = None
    if req.params.prompt_logprobs is not None and len(req.output_ids) == 1:
        prompt, state.prompt_logprobs = [None, *state.prompt_logprobs], []
    return (None if lp is None else [lp]), prompt
