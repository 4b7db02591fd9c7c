"""Hybrid models in the simulator (sim/hybrid.py): a simulated worker runs the engine's
mamba_radix cache over a KV pool and a state-slot pool sized from one budget, checkpoints where
the engine's checkpointer takes them; the router's index can be checkpoint-aware or blind."""

from __future__ import annotations

import pytest

from radixray.cache_index import ChunkCache
from radixray.cache_index.events import MAMBA, BlockStored
from radixray.cache_index.mamba_radix_cache import MambaRadixCache
from radixray.sim import SimConfig, simulate
from radixray.sim.hybrid import (
    GRANITE_4_H_SMALL,
    QWEN3_NEXT_80B,
    REQUEST_ENDS,
    HybridPools,
    HybridSimWorker,
    hybrid_pools,
    hybrid_timing,
    state_copy_seconds,
)
from radixray.sim.sim_cli import main
from radixray.sim.timing import TIMING_PRESETS
from radixray.sim.workload import SimRequest, Workload

P = 4
TIMING = hybrid_timing(GRANITE_4_H_SMALL).with_(max_batch_tokens=32, max_running=4)

# A 42-token prompt (10 full pages), then one that shares its first 24 tokens, then one that
# extends the whole first prompt; each arrives long after the one before has finished.
A = ((1, 42),)
REQS = [
    SimRequest(0, 0.0, A, 1),
    SimRequest(1, 10.0, ((1, 24), (2, 12)), 1),
    SimRequest(2, 20.0, ((1, 42), (3, 10)), 1),
]


def test_layouts_state_and_kv_bytes_from_their_configs():
    """Granite-4.0-H-Small: 4 attention layers x K,V x 8 heads x 128 x bf16; 36 Mamba2 layers,
    each a conv state of 8,448 channels x 3 (bf16) and an SSM state of 128 x 64 x 128 (f32)."""
    assert GRANITE_4_H_SMALL.kv_bytes_per_token == 16384
    assert GRANITE_4_H_SMALL.state_bytes == 36 * (8448 * 3 * 2 + 128 * 64 * 128 * 4) == 152819712
    assert QWEN3_NEXT_80B.kv_bytes_per_token == 12 * 2 * 2 * 256 * 2
    assert QWEN3_NEXT_80B.state_bytes == 36 * (8192 * 3 * 2 + 32 * 128 * 128 * 4)


def test_pools_from_one_budget_and_a_worker_built_with_them():
    """60 GiB less 128 slots of 152,819,712 bytes leaves 5,348 pages of 512 x 16 KiB."""
    budget = 60 << 30
    assert hybrid_pools(GRANITE_4_H_SMALL, budget, 512, 128) == (5348, 128)
    assert hybrid_pools(GRANITE_4_H_SMALL, budget, 512, 1) == ((budget - 152819712) // (1 << 23), 1)
    with pytest.raises(ValueError, match="not one 512-token KV page"):
        hybrid_pools(GRANITE_4_H_SMALL, 400 * 152819712, 512, 400)
    with pytest.raises(ValueError, match="state_slots must be >= 1"):
        hybrid_pools(GRANITE_4_H_SMALL, budget, 512, 0)
    wl = Workload("one", REQS[:1], 0)
    w = HybridSimWorker(0, 5348, 512, TIMING, wl, state_slots=128)
    assert w.allocator.num_pages == 5348 and w.state_slots.num_pages == 128
    assert isinstance(w.cache, MambaRadixCache) and w.scheduler.pages.states.step == 512


def test_timing_scaled_from_the_gpu_preset():
    g, t = TIMING_PRESETS["gpu"], hybrid_timing(GRANITE_4_H_SMALL)
    assert t.step_overhead_s == pytest.approx(g.step_overhead_s * 4.0)
    assert t.prefill_token_s == pytest.approx(g.prefill_token_s * 1.23)
    assert t.prefill_attn_s == pytest.approx(g.prefill_attn_s / 8)  # 4 x 32 x 128 of 32 x 32 x 128
    assert t.decode_ctx_s == pytest.approx(g.decode_ctx_s / 8)  # 16 KiB of 128 KiB
    rw = 2 * 152819712 / 131072 * g.decode_ctx_s  # a slot read and written each decode step
    assert t.decode_seq_s == pytest.approx(g.decode_seq_s * 1.23 + rw)
    assert (t.max_running, t.overlap_layers, t.kv_bytes_per_token) == (64, 0, 16384)
    assert state_copy_seconds(GRANITE_4_H_SMALL, t) == pytest.approx(rw)


def _serve(interval: int) -> tuple[HybridSimWorker, dict[int, int], list]:
    """One worker serves REQS in turn: (worker, cached tokens per request, its KV events)."""
    wl = Workload("three", REQS, 0)
    cached: dict[int, int] = {}
    w = HybridSimWorker(
        0, 64, P, TIMING, wl, state_slots=8, state_interval=interval,
        on_first_token=lambda r, c, now: cached.__setitem__(r.rid, c),
    )  # fmt: skip
    events, now = [], 0.0
    for k, req in enumerate(wl.requests):
        dt = w.enqueue(req, wl.block_hashes(P)[k], max(now, req.arrival))
        while dt is not None:
            now += dt
            dt = w.step_end(now)
        events += w.cache.take_events()
        w.check_integrity()
    return w, cached, events


def test_checkpoints_where_the_engine_takes_them_and_matches_cut_there():
    """Interval 16: checkpoints after 16 and 32 tokens and at the prompt's last full page (40).
    The second prompt shares 24 tokens and resumes at 16; the third resumes at 40."""
    w, cached, events = _serve(16)
    hashes = Workload("a", REQS[:1], 0).block_hashes(P)[0]
    stored = [
        h for e in events if isinstance(e, BlockStored) and e.kind == MAMBA for h in e.block_hashes
    ]
    assert stored[:3] == [hashes[3], hashes[7], hashes[9]]  # blocks ending at 16, 32, 40
    assert cached == {0: 0, 1: 16, 2: 40}
    assert w.state_copies > 0 and w.state_slots.num_free < 8  # saves and restores; some kept


def test_request_end_checkpoints_only_and_a_chunk_cache():
    """With checkpoints only at prompts' last full pages the second prompt finds none within
    its 24 shared tokens; a chunk cache reuses nothing."""
    _, cached, _ = _serve(REQUEST_ENDS)
    assert cached == {0: 0, 1: 0, 2: 40}
    wl = Workload("three", REQS, 0)
    w = HybridSimWorker(0, 64, P, TIMING, wl, state_slots=4, cache="chunk")
    assert isinstance(w.cache, ChunkCache) and w.checkpoints == 0


def _records(index_states: bool):
    cfg = SimConfig(
        num_workers=1, num_pages=64, page_size=P, timing=TIMING,
        hybrid=HybridPools(8, 16, index_states=index_states),
    )  # fmt: skip
    return simulate(Workload("three", REQS, 0), "ttft", cfg).records


def test_the_aware_index_predicts_what_the_worker_delivers_and_the_blind_one_more():
    """The second request: 24 tokens of KV are cached, the deepest checkpoint within them is at
    16. The checkpoint-aware index predicts the 16 the worker delivers, the blind one 24."""
    aware = _records(True)
    assert [(r.predicted_cached, r.cached) for r in aware] == [(0, 0), (16, 16), (40, 40)]
    blind = _records(False)
    assert [(r.predicted_cached, r.cached) for r in blind] == [(0, 0), (24, 16), (40, 40)]


def test_a_hybrid_refuses_a_host_tier_and_a_window():
    with pytest.raises(ValueError, match="no window pool and no host tier"):
        SimConfig(hybrid=HybridPools(8), host_pages=16)
    with pytest.raises(ValueError, match="HybridPools.cache must be one of"):
        HybridPools(8, cache="radix")
    with pytest.raises(ValueError, match="state_interval must be an int >= 1"):
        HybridPools(8, 0)


def test_cli_runs_a_hybrid_layout(capsys):
    rc = main(
        ["--workload", "multiturn_chat", "--limit", "60", "--workers", "2", "--pages", "200",
         "--model-layout", "qwen3-next", "--state-interval", "32", "--state-slots", "12",
         "--policies", "ttft", "--no-progress"]
    )  # fmt: skip
    out = capsys.readouterr()
    assert rc == 0 and "ttft" in out.out
    assert "qwen3-next, mamba_radix, state interval 32" in out.err
    assert "gpu scaled to Qwen3-Next-80B-A3B" in out.err
