"""The window layers' own pool (docs/window_cache.md): greedy output with the window pool (cache
off, and swa_radix) equals today's single pool, with prefix sharing, chunked prefill and
preemption; window pages out of every request's window go back as it runs."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from radixray.cache_index import (
    ApproxIndex,
    EventBatch,
    PageAllocator,
    decode_events,
    encode_events,
    hash_blocks,
)
from radixray.cache_index.swa_radix_cache import SWARadixCache
from radixray.cache_index.window_pages import WindowedAllocator
from radixray.model_meta.byte_tokenizer import ByteTokenizer
from radixray.model_meta.model_config import tiny_config
from radixray.worker import Engine, EngineConfig, SamplingParams
from radixray.worker import engine as engine_module
from radixray.worker.memory_pool import KVPool
from radixray.worker.model.hf_weights import hf_names
from radixray.worker.model.loader import _build, random_hf_state_dict

W = 8  # the window of the window layers, in tokens (two pages of 4)
LAYOUTS = {
    # Gemma 3's shape: window layers around a full one, its norms and soft-capped logits
    "gemma3_like": {
        "num_layers": 3,
        "layer_windows": (W, None, W),
        "norm_offset": 1.0,
        "sandwich_norms": True,
        "hidden_act": "gelu_tanh",
        "final_logit_softcap": 30.0,
    },
    # Mistral with a window on every layer: the full pool holds no layer at all
    "mistral_window": {"num_layers": 2, "layer_windows": (W, W)},
}


@pytest.fixture(scope="module", params=list(LAYOUTS))
def loaded(request):
    cfg = dataclasses.replace(tiny_config(), name=request.param, **LAYOUTS[request.param])
    state = random_hf_state_dict(cfg, 0)
    g = torch.Generator().manual_seed(1)
    for name in hf_names(cfg):  # the sandwich norms random_hf_state_dict does not make
        if name not in state:
            state[name] = 0.1 * torch.randn(cfg.hidden_size, generator=g)
    model = _build(cfg, state, "cpu", torch.float32)
    return model, cfg, ByteTokenizer()


PROMPTS = [
    list(range(1, 30)),
    list(range(1, 30)) + [7, 7, 7, 7, 7],  # shares the first prompt's pages
    [5] * 3 + list(range(40, 61)),
    list(range(1, 13)),  # a prefix of the first: matched only where its window is there
]
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def _run(loaded, monkeypatch, plain: bool, **cfg):
    """Token ids of every prompt, twice (the second round from the cache), and the engine."""
    if plain:  # today's single pool: every layer in one pool, the plain radix cache
        monkeypatch.setattr(engine_module, "cache_kind", lambda cache, mcfg: cache)
    config = EngineConfig(
        model="tiny", device="cpu", page_size=4, max_batch_tokens=16, debug_checks=True, **cfg
    )
    engine = Engine(config, loaded=loaded)
    first = [c.token_ids for c in engine.generate_batch(PROMPTS, GREEDY)]
    again = engine.generate_batch(PROMPTS, GREEDY)
    engine.check_integrity()
    monkeypatch.undo()
    return first, [c.token_ids for c in again], engine


@pytest.fixture(scope="module")
def single_pool(loaded):
    """``_run`` on today's single pool (64 pages): the reference the tests below compare with,
    run once per layout (greedy on fixed weights: the same tokens every time)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        return _run(loaded, monkeypatch, True, num_pages=64)


def test_window_pool_output_equals_single_pool_and_cache_off(loaded, single_pool, monkeypatch):
    expected, _, plain = single_pool
    assert plain.pool.window_k is None
    off_first, off_again, off = _run(loaded, monkeypatch, False, cache="chunk", num_pages=64)
    assert off.pool.window_k is not None and off_first == expected and off_again == expected
    swa_first, swa_again, swa = _run(loaded, monkeypatch, False, num_pages=64)
    assert swa.cache_kind == "swa_radix" and isinstance(swa.cache, SWARadixCache)
    assert swa_first == expected and swa_again == expected
    assert swa.scheduler.pages.num_window_dropped > 0  # pages did leave the window


def test_a_prefix_whose_window_was_dropped_is_a_window_miss(loaded):
    engine = Engine(
        EngineConfig(model="tiny", device="cpu", page_size=4, num_pages=64), loaded=loaded
    )
    (long,) = engine.generate_batch([PROMPTS[0]], GREEDY)
    # its first pages are cached, but their window pages were dropped as it ran: a prefix that
    # ends there is present and not reusable; one that ends at its end is
    (short,) = engine.generate_batch([PROMPTS[3]], GREEDY)
    assert short.miss["window"] == 8 and short.cached_tokens == 0
    (again,) = engine.generate_batch([PROMPTS[0] + long.token_ids + [3]], GREEDY)
    assert again.cached_tokens == 52 and again.miss["window"] == 0
    engine.check_integrity()


def test_window_pool_under_pressure_preempts_and_still_equals(loaded, single_pool, monkeypatch):
    expected, _, _ = single_pool
    # 20 full pages for 4 requests of up to 15 pages each, and few window pages: preemption,
    # and window pages dropped from the cache to make room
    first, again, swa = _run(loaded, monkeypatch, False, num_pages=20, window_pages=12)
    assert first == expected and again == expected
    assert swa.scheduler.num_preemptions > 0 and swa.cache.num_window_evicted > 0
    stats = swa.stats()
    assert stats["window_total_pages"] == 12 and stats["window_evicted_pages"] > 0
    assert stats["window_dropped_pages"] > 0 and 0 <= stats["window_free_pages"] <= 12
    off_first, _, off = _run(loaded, monkeypatch, False, cache="chunk", num_pages=20)
    assert off_first == expected and off.scheduler.num_preemptions > 0


def test_requests_hold_only_their_window(loaded):
    """Decoding far past the window, a request holds window pages for its last W positions
    only (page-aligned), while it holds full pages for all of them."""
    model, cfg, tok = loaded
    engine = Engine(
        EngineConfig(model="tiny", device="cpu", page_size=4, num_pages=64, cache="chunk"),
        loaded=loaded,
    )
    alloc = engine.pool.allocator
    seen = []
    orig = engine.scheduler.postprocess

    def spy(batch):
        orig(batch)
        for r in engine.scheduler.running:
            held = sum(map(alloc.has_window, r.pages))
            seen.append((r.num_computed, len(r.pages), held))

    engine.scheduler.postprocess = spy
    engine.generate_batch([list(range(1, 10))], SamplingParams(max_tokens=40, ignore_eos=True))
    for computed, pages, held in seen:
        first_needed = max(0, computed - W + 1)  # a query at >= computed sees keys > pos - W
        assert held == pages - first_needed // 4
    assert seen[-1][1] >= 12 and seen[-1][2] <= 3


def test_pool_layout_and_bytes():
    cfg = dataclasses.replace(tiny_config(), num_layers=3, layer_windows=(W, None, W))
    pool = KVPool(3, 10, 4, 2, 16, window_layers=(0, 2), window_pages=5, window=W)
    assert pool.k_cache.shape == (1, 10, 4, 2, 16) and pool.window_k.shape == (2, 5, 4, 2, 16)
    assert pool.layer_slots == [(True, 0), (False, 0), (True, 1)]
    assert isinstance(pool.allocator, WindowedAllocator)
    pages = pool.allocator.alloc(3)
    assert pool.held_bytes(pages) == 3 * pool.page_bytes + 3 * pool.window_page_bytes
    assert pool.window_page_bytes == 2 * pool.page_bytes  # two window layers, one full
    pool.allocator.drop_window(pages[:2])
    assert pool.held_bytes(pages) == 3 * pool.page_bytes + pool.window_page_bytes
    assert isinstance(KVPool(3, 10, 4, 2, 16).allocator, PageAllocator)
    assert cfg.window(1) is None


def test_config_errors(loaded):
    with pytest.raises(ValueError, match="sliding-window"):
        Engine(EngineConfig(model="tiny", cache="swa_radix", device="cpu", num_pages=8))


def test_samples_fork_the_window_pool(loaded, single_pool):
    """n samples of one prompt: the followers copy the leader's private pages in both pools
    (greedy: every sample is the single pool's answer)."""
    expected, _, _ = single_pool
    for cache in ("radix", "chunk"):  # a partial page copied; every computed page copied
        engine = Engine(
            EngineConfig(
                model="tiny",
                cache=cache,
                device="cpu",
                page_size=4,
                num_pages=64,
                max_batch_tokens=64,
                debug_checks=True,
            ),
            loaded=loaded,
        )
        params = SamplingParams(n=3, max_tokens=24, temperature=0.0, ignore_eos=True)
        out = engine.generate_batch([PROMPTS[0]], params)
        assert [c.token_ids for c in out] == [expected[0]] * 3
        engine.check_integrity()


def test_the_router_index_predicts_what_the_worker_delivers(loaded):
    """The worker's KV events (through the wire codec) into an ApproxIndex: for each next
    prompt the index predicts exactly the cached tokens the worker then reuses, windows
    dropped or not."""
    engine = Engine(
        EngineConfig(model="tiny", device="cpu", page_size=4, num_pages=64), loaded=loaded
    )
    index = ApproxIndex(4)
    seq = 0

    def sync():
        nonlocal seq
        seq += 1
        wire = encode_events(EventBatch("w", seq, 0.0, engine.take_events()))
        index.apply("w", decode_events(wire))

    (long,) = engine.generate_batch([PROMPTS[0]], GREEDY)
    sync()
    assert index.window_of("w") == W
    grown = PROMPTS[0] + long.token_ids + [3]
    cut = 0  # prompts whose full blocks were there but not their window
    for prompt in (PROMPTS[3], grown, PROMPTS[0][:20], grown[:40], grown + [9] * 6):
        usable = (len(prompt) - 1) // 4  # the last token is always computed
        hashes = hash_blocks(prompt[: usable * 4], 4)
        predicted = index.prefix_on("w", hashes) * 4
        held = index.blocks("w")
        cut += next((i for i, h in enumerate(hashes) if h not in held), len(hashes)) * 4 > predicted
        (c,) = engine.generate_batch([prompt], GREEDY)
        assert c.cached_tokens == predicted, prompt
        sync()
    assert cut >= 2
    snap = ApproxIndex(4)
    snap.apply("w", engine.snapshot_events())
    assert snap.blocks("w") == index.blocks("w")
    assert snap.window_of("w") == index.window_of("w") is not None
    assert snap.window_blocks("w") == index.window_blocks("w")
