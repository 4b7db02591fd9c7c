"""Miss attribution: why each prompt token of a request was or was not reused (the causes are
``radixray.protocol.MISS_CAUSES``; docs/architecture.md, "Miss attribution"). Ints only."""

from __future__ import annotations

from radixray.cache_index import PrefixCache
from radixray.cache_index.prefix_cache import MatchResult
from radixray.protocol import MISS_CAUSES

from .request import Request

__all__ = ["attribute"]


def attribute(
    req: Request, m: MatchResult, in_flight: set[int], host: int, cache: PrefixCache | None
) -> dict[str, int]:
    """Split ``req``'s prompt tokens by cause, at its admission on the match ``m``:
    ``m.num_tokens`` were on the device (``cached``), the ``host`` after them loaded back;
    after those, cached but not reusable, ``m.window_tokens`` (their window was dropped:
    ``window``) then ``m.state_tokens`` (KV with no state checkpoint at or after it:
    ``state``); the unaligned tail and the last token's page are ``page_tail``; each page after
    all that is ``in_flight`` (a running request computes it), ``evicted`` (held once, gone
    from both tiers: the ghost list), ``state`` (computed here once but never kept: no state
    checkpoint at or after it, ``MambaRadixCache.was_unkept``) or ``cold``. ``cache`` None:
    reuse is off, all ``disabled``. The values sum to the prompt length."""
    miss = dict.fromkeys(MISS_CAUSES, 0)
    L = req.num_prompt
    if cache is None:
        miss["disabled"] = L
        return miss
    P = cache.page_size
    cached = min(m.num_tokens, L)
    host = min(host, L - cached)
    reusable = (L - 1) // P  # pages that could ever be matched (the last token is computed)
    miss["cached"] = cached
    miss["host"] = host
    miss["window"] = max(0, min(m.window_tokens, reusable * P - cached - host))
    miss["state"] = max(0, min(m.state_tokens, reusable * P - cached - host - miss["window"]))
    miss["page_tail"] = L - max(reusable * P, cached + host)
    unkept = getattr(cache, "was_unkept", None)
    for j in range((cached + host + miss["window"] + miss["state"]) // P, reusable):
        h = req.block_hashes[j]
        if h in in_flight:
            miss["in_flight"] += P
        elif cache.was_evicted((h,)):
            miss["evicted"] += P
        elif unkept is not None and unkept((h,)):
            miss["state"] += P
        else:
            miss["cold"] += P
    return miss
