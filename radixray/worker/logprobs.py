"""Log-probabilities of sampled and prompt tokens, from the raw logits (before temperature and
every logits control: vLLM's default), batched: one log-softmax and one top-k over the rows that
ask (on a CPU in cache-sized pieces of rows), on the device, and one copy to the host; nothing
when no row asks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from radixray.protocol import TokenLogprob

from .model.upload import upload

__all__ = ["CHUNK_BYTES", "keep_prompt_logprobs", "token_logprobs", "with_logprobs"]


# Rows go through the log-softmax and top-k this many bytes of logits at a time. One pass over a
# prefill's prompt rows at once (512 rows of a 49k vocabulary: 100 MB, and as much again for
# the copy of the rows and the log-softmax) spends most of its time faulting in fresh memory;
# in pieces that stay in the CPU's cache it is 3-6x faster (benchmarks/README.md, "Logprobs").
CHUNK_BYTES = 4 << 20


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
    k = min(max(counts[i] for i in rows), logits.shape[-1])
    every = len(rows) == logits.shape[0]  # (prompt rows all ask: no copy of them)
    idx = None if every else upload(rows, torch.long, dev)
    chosen_ids = upload([tokens[i] for i in rows], torch.long, dev)[:, None]
    # (on an accelerator the caching allocator has no fresh memory to fault in: one pass)
    step = max(1, CHUNK_BYTES // (4 * logits.shape[-1])) if dev.type == "cpu" else len(rows)
    chosen, top_vals, top_ids = [], [], []
    for at in range(0, len(rows), step):
        part = logits[at : at + step] if every else logits.index_select(0, idx[at : at + step])
        lp = torch.log_softmax(part.float(), dim=-1)
        chosen.append(lp.gather(1, chosen_ids[at : at + step])[:, 0])
        if k:
            top = torch.topk(lp, k, dim=-1)
            top_vals.append(top.values)
            top_ids.append(top.indices)
    chosen = torch.cat(chosen).tolist()  # one copy to the host (each)
    if k:
        top_vals, top_ids = torch.cat(top_vals).tolist(), torch.cat(top_ids).tolist()
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
