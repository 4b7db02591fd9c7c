"""Write-through after N hits in the engine (tiny Llama on the CPU): greedy output equals reuse
off exactly, and prefixes copied ahead are demoted later without a second copy."""

from __future__ import annotations

import pytest

from .test_engine import GREEDY, engine, shared_prefix_prompts, tokens
from .test_host_tier_engine import assert_no_leak


@pytest.mark.parametrize("hits", [1, 2])
def test_greedy_with_write_through_equals_reuse_off(hits):
    P = 4
    prompts = shared_prefix_prompts(seed=hits, n=10)
    want = tokens(engine(cache="chunk", page_size=P).generate_batch(prompts, GREEDY))
    pages = -(-60 // P) * 2 + 2
    e = engine(page_size=P, num_pages=pages, host_pages=400, max_batch_tokens=32,
               host_write_through_hits=hits)  # fmt: skip
    assert tokens(e.generate_batch(prompts, GREEDY)) == want
    assert tokens(e.generate_batch(prompts, GREEDY)) == want  # warm: loads from the host
    s = e.stats()
    tier = e.cache.host
    assert tier.written_through_pages > 0 and s["loaded_pages"] > 0, s
    # every page copied out was a demotion's or a write-through's, each page once per copy
    assert s["bytes_to_host"] == (s["demoted_pages"] + tier.written_through_pages) * (
        e.pool.page_bytes
    )
    assert_no_leak(e)
