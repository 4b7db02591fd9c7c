"""The host tier of a window cache in the engine (docs/window_cache.md, docs/host_tier.md): on
the tiny Gemma-3-like and all-window models, with a device pool smaller than the working set,
greedy output with demotions and load-backs of full and window pages equals cache off exactly."""

from __future__ import annotations

from radixray.cache_index.swa_radix_cache import SWARadixCache
from radixray.cache_index.window_pages import WindowedAllocator
from radixray.worker import Engine, EngineConfig

from .test_window_pool import GREEDY, PROMPTS, _run, loaded  # noqa: F401 (the fixture)


def test_host_tier_with_window_pool_equals_cache_off(loaded, monkeypatch):  # noqa: F811
    off_first, _, _ = _run(loaded, monkeypatch, False, cache="chunk", num_pages=64)
    # 20 full pages (the four prompts need up to 15 each), 12 window pages, a host tier that
    # holds everything: the second round loads back full and window pages
    first, again, e = _run(loaded, monkeypatch, False, num_pages=20, window_pages=12, host_pages=64)
    assert isinstance(e.cache, SWARadixCache) and e.cache.host is not None
    assert isinstance(e.pool.host_allocator, WindowedAllocator)
    assert first == off_first and again == off_first
    s = e.stats()
    assert s["demoted_pages"] > 0 and s["preemptions"] > 0, s
    assert e.pool.copier.forward_layers > 0  # run layer by layer, window layers included
    e.check_integrity()


def test_a_demoted_prefix_is_loaded_back_with_its_window(loaded):  # noqa: F811
    e = Engine(
        EngineConfig(
            model="tiny", device="cpu", page_size=4, num_pages=20, host_pages=64, debug_checks=True
        ),
        loaded=loaded,
    )
    (first,) = e.generate_batch([PROMPTS[0]], GREEDY)
    for i in range(2):  # push it out of the device pool
        e.generate_batch([[60 + i] * 40], GREEDY)
    again_prompt = PROMPTS[0] + first.token_ids + [3]
    m = e.cache.match_prefix(again_prompt)
    assert m.host_tokens > 0
    (again,) = e.generate_batch([again_prompt], GREEDY)
    assert again.miss["host"] > 0 and again.miss["window"] == 0
    assert e.cache.host.demoted_window_pages > 0 and e.cache.host.loaded_window_pages > 0
    (ref,) = _fresh(loaded).generate_batch([again_prompt], GREEDY)
    assert again.token_ids == ref.token_ids
    e.check_integrity()


def _fresh(loaded):  # noqa: F811
    return Engine(
        EngineConfig(model="tiny", device="cpu", page_size=4, cache="chunk"), loaded=loaded
    )
