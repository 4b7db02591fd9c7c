"""A minimal greedy decoding loop over a throwaway paged KV pool: for tests and smoke checks of a
loaded model, not a serving path (the engine owns batching, caching and sampling)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from .attention import AttentionMetadata
from .llama import LlamaModel

__all__ = ["greedy_generate", "new_kv_cache"]


def new_kv_cache(
    model: LlamaModel, num_pages: int, page_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeroed key and value pools ``[kv layers, num_pages, page_size, num_kv_heads, head_dim]``
    (``kv layers``: the attention layers, all of them but a hybrid's state layers)."""
    c = model.config
    shape = (len(c.attention_layers), num_pages, page_size, c.num_kv_heads, c.head_dim)
    return (
        torch.zeros(shape, dtype=model.dtype, device=model.device),
        torch.zeros(shape, dtype=model.dtype, device=model.device),
    )


@torch.inference_mode()
def greedy_generate(
    model: LlamaModel,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    stop_token_ids: Iterable[int] = (),
    page_size: int = 16,
) -> list[int]:
    """Prefill ``prompt_ids`` in one step, then decode one token per step by argmax until a stop
    token (included in the output) or ``max_new_tokens``. Returns the generated ids only."""
    if not prompt_ids:
        raise ValueError("greedy_generate needs a non-empty prompt")
    stops = set(stop_token_ids)
    total = len(prompt_ids) + max_new_tokens
    num_pages = -(-total // page_size)
    k_cache, v_cache = new_kv_cache(model, num_pages, page_size)
    # Pages in reverse order: a non-contiguous table costs nothing and exercises the indexing.
    pages = list(reversed(range(num_pages)))
    out: list[int] = []
    step_ids, cached = list(prompt_ids), 0
    while len(out) < max_new_tokens:
        attn, positions = AttentionMetadata.build(
            [pages], [cached], [len(step_ids)], page_size, model.device
        )
        ids = torch.tensor(step_ids, dtype=torch.int64, device=model.device)
        logits = model(ids, positions, attn, k_cache, v_cache)
        token = int(logits[0].argmax())
        out.append(token)
        if token in stops:
            break
        cached += len(step_ids)
        step_ids = [token]
    return out
