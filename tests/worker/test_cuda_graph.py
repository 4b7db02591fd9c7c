"""Decode steps on CUDA graphs' static buffers (worker/cuda_graph.py).

On the CPU the graphs' padded forward runs eagerly (``capture=False``): its greedy tokens equal
the plain forward's, padding rows store nothing, and only pure decode steps take it. On CUDA
(``-m gpu``) the captured graphs replay: greedy tokens equal eager CUDA's and the CPU's."""

from __future__ import annotations

import pytest
import torch

from radixray.worker import EngineConfig, SamplingParams
from radixray.worker.cuda_graph import batch_sizes

from .test_engine import GREEDY, assert_no_leak, engine, shared_prefix_prompts, tokens


def test_batch_sizes_ladder():
    assert batch_sizes(1) == [1]
    assert batch_sizes(3) == [1, 2, 4]
    assert batch_sizes(8) == [1, 2, 4, 8]
    assert batch_sizes(20) == [1, 2, 4, 8, 16, 24]
    big = batch_sizes(256)
    assert big[:5] == [1, 2, 4, 8, 16] and big[-1] == 256 and len(big) == 35
    assert all(b - a == 8 for a, b in zip(big[3:], big[4:], strict=False))
    with pytest.raises(ValueError, match="max_batch must be >= 1, got 0"):
        batch_sizes(0)


def padded(**kw):
    """An engine whose decode steps run the graphs' padded forward, eagerly."""
    e = engine(**kw)
    e.runner.use_graphs(8, e.max_model_len, capture=False)
    assert e.runner.graphs is not None and e.runner.graphs_off is None
    return e


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("P", [1, 4])
def test_padded_decode_equals_the_plain_forward(backend, P):
    prompts = shared_prefix_prompts(seed=P, n=7)
    kw = {"page_size": P, "attention_backend": backend}
    ref = engine(**kw)
    e = padded(**kw)
    for batch in (prompts[:5], prompts[5:], prompts[:1]):  # padded to 8, 2 (exact) and 1
        want = tokens(ref.generate_batch(batch, GREEDY))
        assert tokens(e.generate_batch(batch, GREEDY)) == want
    # every decode step took it (11 per batch), and a one-token prefill that samples (a prompt
    # cached but for its last token) may too
    assert 3 * (GREEDY.max_tokens - 1) <= e.runner.graphs.replays <= 3 * GREEDY.max_tokens
    assert_no_leak(e)


def test_padding_rows_store_nothing():
    """A decode step of 3 requests padded to 4 writes exactly the 3 new tokens' KV slots."""
    e = padded(page_size=4, num_pages=64)
    for p in shared_prefix_prompts(seed=3, n=3):
        e.add_request(p, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    while e.runner.graphs.replays == 0:
        before = e.pool.k_cache.clone(), e.pool.v_cache.clone()
        running = [(r, r.num_tokens) for r in e.scheduler.running]
        e.step()
    assert len(running) == 3
    P = e.page_size
    want = sorted(r.pages[(n - 1) // P] * P + (n - 1) % P for r, n in running)
    for old, new in zip(before, (e.pool.k_cache, e.pool.v_cache), strict=True):
        changed = (old != new).flatten(3).any(-1).any(0).flatten().nonzero().flatten()
        assert changed.tolist() == want


def record_replays(monkeypatch) -> list[tuple[bool, tuple[bool, bool] | None, bool]]:
    """Spy on every graph replay (``DecodeGraphs.run``): a list of ``(copies still staged, the
    last hand-over of copies before it: (any copies, layered), whether the replay ran layers'
    copies itself)``; the step's own hand-over is the last one before its forward."""
    from radixray.worker.cuda_graph import DecodeGraphs
    from radixray.worker.memory_pool import KVPool

    replays, run, host_copies = [], DecodeGraphs.run, KVPool.host_copies
    handed = [None]

    def copies_spy(self, copies, layered=False, wait=False):
        handed[0] = (bool(copies), layered)
        return host_copies(self, copies, layered, wait)

    def replay_spy(self, rows, fix=None):
        copier = self.pool.copier
        done = copier.forward_layers  # layers whose copies a forward ran so far
        staged = copier.staged()
        out = run(self, rows, fix)
        replays.append((staged, handed[0], copier.forward_layers != done))
        return out

    monkeypatch.setattr(KVPool, "host_copies", copies_spy)
    monkeypatch.setattr(DecodeGraphs, "run", replay_spy)
    return replays


def test_host_copies_complete_before_a_replay(monkeypatch):
    """Prefill steps run eagerly with their copies layer by layer; a decode step with copies
    (demotions for its new pages, a prompt loaded back but for its last token) runs all of them
    first, then the padded forward: none is left staged for layers a replay has none of.
    Greedy output equals reuse off, exactly."""
    prompts = shared_prefix_prompts(seed=4, n=10)
    want = tokens(engine(cache="chunk").generate_batch(prompts, GREEDY))
    e = padded(num_pages=32, host_pages=400, max_batch_tokens=32)
    replays = record_replays(monkeypatch)
    assert tokens(e.generate_batch(prompts, GREEDY)) == want
    assert tokens(e.generate_batch(prompts, GREEDY)) == want  # loads back from the host
    s = e.stats()
    assert s["loaded_pages"] > 0 and s["demoted_pages"] > 0
    assert 0 < len(replays) == e.runner.graphs.replays < e.meter.steps
    assert not any(ran for *_, ran in replays)  # a replay runs no layer's copies itself
    assert not any(staged or layered for staged, (_, layered), _ in replays)
    assert any(copied for _, (copied, _), _ in replays)  # some replays came right after copies
    assert e.pool.copier.forward_layers > 0  # and prefill steps ran theirs by layer
    assert_no_leak(e)


def test_cpu_engine_says_why_it_runs_eagerly():
    e = engine()
    assert e.runner.graphs is None and e.runner.graphs_off == "no CUDA (cpu)"
    e = engine(cuda_graph_max_batch=0)
    assert e.runner.graphs_off == "off (cuda_graph_max_batch 0)"


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_cuda_graph_max_batch_is_checked(bad):
    with pytest.raises(ValueError, match="--cuda-graph-max-batch must be an int >= 0"):
        EngineConfig(model="tiny", cuda_graph_max_batch=bad)


@pytest.mark.gpu
@pytest.mark.parametrize("P", [1, 16])
def test_cuda_graphs_replay_greedy_tokens_of_eager_cuda_and_cpu(P):
    """float32 on CUDA: graphs (batches 5, 2 and 1 replay sizes 8, 2 and 1) against eager CUDA
    and the CPU, exactly."""
    prompts = shared_prefix_prompts(seed=P, n=7)
    kw = {"page_size": P, "max_running": 8, "debug_checks": False}
    cpu = engine(**kw)
    eager = engine(device="cuda", cuda_graph_max_batch=0, **kw)
    e = engine(device="cuda", **kw)
    g = e.runner.graphs
    assert g is not None and sorted(g.graphs) == [1, 2, 4, 8]  # captured at start-up
    for batch in (prompts[:5], prompts[5:], prompts[:1]):
        want = tokens(cpu.generate_batch(batch, GREEDY))
        assert tokens(eager.generate_batch(batch, GREEDY)) == want
        assert tokens(e.generate_batch(batch, GREEDY)) == want
    assert 3 * (GREEDY.max_tokens - 1) <= g.replays <= 3 * GREEDY.max_tokens
    assert eager.runner.graphs is None
    torch.cuda.synchronize()
