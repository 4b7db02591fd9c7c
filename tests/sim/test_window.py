"""Sliding-window models in the simulator (sim/window.py): a simulated worker runs the engine's
swa_radix cache over a window pool; the router's index can be window-aware or window-blind;
the Gemma-3-12B layout, its pools at a memory budget and its timing model."""

from __future__ import annotations

import pytest

from radixray.cache_index import ApproxIndex, hash_blocks
from radixray.cache_index.swa_radix_cache import SWARadixCache
from radixray.cache_index.window_pages import WindowedAllocator, window_pages_needed
from radixray.sim import SimConfig, multiturn_chat, simulate
from radixray.sim.timing import TIMING_PRESETS
from radixray.sim.window import (
    GEMMA3_12B,
    WINDOW_SHARE,
    SWASimWorker,
    gemma3_12b_timing,
    plain_pages,
    pool_pages,
)
from radixray.sim.workload import SimRequest, Workload

P, W = 4, 8
TIMING = TIMING_PRESETS["cpu"].with_(max_batch_tokens=32, max_running=4)


def _serve(worker: SWASimWorker, wl: Workload) -> None:
    now = 0.0
    for k, req in enumerate(wl.requests):
        dt = worker.enqueue(req, wl.block_hashes(P)[k], now)
        while dt is not None:
            now += dt
            dt = worker.step_end(now)
        worker.check_integrity()


def _recording_worker(wl: Workload, window_pages: int) -> tuple[SWASimWorker, dict[int, int]]:
    """A 32-page windowed worker and the cached tokens of each request's first token."""
    cached: dict[int, int] = {}
    w = SWASimWorker(
        0, 32, P, TIMING, wl, window=W, window_pages=window_pages,
        on_first_token=lambda r, c, now: cached.__setitem__(r.rid, c),
    )  # fmt: skip
    return w, cached


def test_a_sim_worker_runs_swa_radix_and_cuts_a_prefix_whose_window_is_gone():
    """A 40-token prompt leaves window pages only for its last window; its first 20 tokens
    again hit nothing (the window before token 20 is gone), the whole prompt plus more hits
    its 40 tokens."""
    reqs = [
        SimRequest(0, 0.0, ((1, 40),), 1),
        SimRequest(1, 1.0, ((1, 20),), 1),
        SimRequest(2, 2.0, ((1, 40), (2, 8)), 1),
    ]
    wl = Workload("three", reqs, 0)
    w, cached = _recording_worker(wl, window_pages=16)
    assert isinstance(w.cache, SWARadixCache) and w.allocator.window == W
    _serve(w, wl)
    assert cached == {0: 0, 1: 0, 2: 40}
    assert w.scheduler.pages.num_window_dropped > 0


def test_a_window_pool_has_no_host_tier_in_the_simulator():
    with pytest.raises(ValueError, match="no host tier"):
        SimConfig(window=W, window_pages=8, host_pages=16)
    wl = Workload("one", [SimRequest(0, 0.0, ((1, 8),), 1)], 0)
    with pytest.raises(ValueError, match="no host tier"):
        SWASimWorker(0, 8, P, TIMING, wl, host_pages=8, window=W, window_pages=8)


def _windowed_worker_events(n_pages: int, keep_from: int):
    """The events of a swa_radix cache that cached ``n_pages`` pages and kept window pages from
    page ``keep_from`` on."""
    alloc = WindowedAllocator(32, 16, W)
    cache = SWARadixCache(P, alloc, enable_events=True)
    toks = list(range(n_pages * P))
    pages = alloc.alloc(n_pages)
    alloc.drop_window(pages[:keep_from])
    cache.insert(toks, pages)
    return cache.take_events(), hash_blocks(toks, P)


def test_a_window_blind_index_predicts_where_full_pages_are_and_the_aware_one_does_not():
    events, hashes = _windowed_worker_events(6, 3)
    aware, blind = ApproxIndex(P), ApproxIndex(P, windows=False)
    for index in (aware, blind):
        index.apply("w", events)
    assert aware.window_of("w") == W and blind.window_of("w") is None
    # pages 0-2 have no window pages: a request starting at page 3 (or earlier) cannot reuse
    assert aware.match(hashes[:3]) == {} and blind.match(hashes[:3]) == {"w": 3}
    assert aware.match(hashes) == blind.match(hashes) == {"w": 6}


def test_a_full_group_store_says_which_blocks_have_window_pages_by_what_follows():
    """The router's own insert counts window pages for the request's last window only; a
    worker's store of the same blocks then replaces that with what the worker kept."""
    events, hashes = _windowed_worker_events(6, 6)  # no window pages at all
    index = ApproxIndex(P)
    index.apply("w", events[:2])  # the full store, the window marker
    index.insert("w", hashes)  # optimistic: the last window (pages 4, 5) only
    assert index.prefix_on("w", hashes) == 6 and index.prefix_on("w", hashes[:4]) == 0
    index.apply("w", events[:1])  # the worker stored them: none has a window page
    assert index.prefix_on("w", hashes) == 0 and index.blocks("w") == set(hashes)


def test_window_aware_routing_mispredicts_less_than_window_blind():
    """Multi-turn chat (150 requests at 1/s) on two workers with small window pools: a
    window-blind index predicts hits on prefixes whose window pages are gone, so more of its
    requests find less cached than it predicted (5 against 63 here). At a rate the two workers
    keep up with, what an index mispredicts is mostly the window; at 4/s (300 requests, eight
    times the CPU: each step peeks every waiting request) queued evictions blur it (62 against
    75)."""
    wl = multiturn_chat(num_requests=150, rate=1.0, seed=1)
    short = {}
    for aware in (True, False):
        cfg = SimConfig(
            num_workers=2, num_pages=120, page_size=16, timing=TIMING.with_(max_batch_tokens=64),
            window=32, window_pages=24, window_index=aware, check_every=50,
        )  # fmt: skip
        r = simulate(wl, "ttft", cfg)
        short[aware] = sum(0 <= x.cached < x.predicted_cached for x in r.records)
    assert short[True] < short[False]


def test_gemma3_12b_layout_pools_and_timing():
    m = GEMMA3_12B
    assert (m.full_bytes_per_token, m.window_bytes_per_token) == (65536, 327680)
    assert m.plain_bytes_per_token == 384 * 1024
    budget = 90 << 30
    assert plain_pages(m, budget, 512) == budget // (512 * 393216) == 480
    full, win = pool_pages(m, budget, 512, 8192)
    assert full == budget // (512 * (65536 + 81920)) == 1280 and win == 320
    assert full * 512 * 65536 + win * 512 * 327680 <= budget
    assert pool_pages(m, 4 << 30, 512, 8192) == (56, 2 * window_pages_needed(1024, 512, 8192))
    t, gpu = gemma3_12b_timing(), TIMING_PRESETS["gpu"]
    assert t.step_overhead_s == pytest.approx(0.018)
    assert t.prefill_token_s == pytest.approx(1.5 / 12000 + 2e-10 * 1.25 * 1024)
    assert t.prefill_attn_s == pytest.approx(5e-11) and t.decode_ctx_s == pytest.approx(1e-8)
    assert t.decode_seq_s == pytest.approx(2.25e-4 + 2e-8 * 1024 * 2.5)
    assert t.max_batch_tokens == gpu.max_batch_tokens and t.kv_bytes_per_token == 393216


def test_the_simulator_sizes_window_pools_as_the_engine_does():
    from radixray.worker.memory_pool import WINDOW_SHARE as ENGINE_SHARE

    assert WINDOW_SHARE == ENGINE_SHARE


def test_a_request_whose_own_path_holds_the_window_pool_is_admitted():
    """A cached 40-token prompt still has all its window pages: 10 of the pool's 11. A request
    that continues it matches all 10 pages and locks them, so evict_window cannot take them;
    the engine drops those its first query does not read (as its first step would) instead of
    waiting for them forever."""
    reqs = [SimRequest(0, 0.0, ((1, 40), (2, 8)), 1)]
    wl = Workload("one", reqs, 0)
    w, cached = _recording_worker(wl, window_pages=11)
    pages = w.allocator.alloc(10)
    w.cache.insert(wl.tokens(reqs[0])[:40], pages)
    assert w.allocator.num_window_free == 1
    _serve(w, wl)
    assert cached == {0: 40}


def test_a_worker_whose_step_preempted_everyone_schedules_again_not_idles():
    """A step can preempt every running request for window pages and admit nobody in the same
    schedule; the engine's loop schedules again at once, and so must a simulated worker, or it
    sits idle with a queue: here 11 requests never finished on one of two workers."""
    timing = TIMING_PRESETS["cpu"].with_(max_batch_tokens=64, max_running=4)
    cfg = SimConfig(num_workers=2, num_pages=120, page_size=16, timing=timing, window=32,
                    window_pages=24, window_index=False)  # fmt: skip
    result = simulate(multiturn_chat(num_requests=300, seed=1, rate=2.0), "ttft", cfg)
    assert len(result.records) == 300  # each finished exactly once (else simulate raises)
    assert all(r.finish == r.finish for r in result.records)  # a finish time (not NaN) each
