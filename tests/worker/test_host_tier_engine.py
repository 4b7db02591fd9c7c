"""The host tier in the engine (tiny Llama on the CPU): greedy output after demotions and
load-backs equals reuse off, exactly; the miss cause ``host``; counters; the config."""

from __future__ import annotations

import pytest

from radixray.protocol import cache_view
from radixray.worker import EngineConfig, SamplingParams

from .test_engine import GREEDY, engine, shared_prefix_prompts, tokens


def assert_no_leak(e) -> None:
    e.check_integrity()  # both tiers' page accounting
    alloc = e.pool.allocator
    assert e.cache.protected_tokens == 0
    assert alloc.num_free + e.cache.total_tokens // e.page_size == alloc.num_pages


def _demote_and_load_back(P: int, device: str = "cpu"):
    """Greedy output with demotions, load-backs and preemptions equals reuse off; the engine."""
    prompts = shared_prefix_prompts(seed=P, n=10)
    want = tokens(engine(cache="chunk", page_size=P, device=device).generate_batch(prompts, GREEDY))
    # The device pool holds ~2 prompts' pages (the working set is more), the host tier all.
    pages = -(-60 // P) * 2 + 2
    e = engine(page_size=P, num_pages=pages, host_pages=400, max_batch_tokens=32, device=device)
    assert e.pool.host_allocator.num_pages == 400
    assert tokens(e.generate_batch(prompts, GREEDY)) == want
    assert tokens(e.generate_batch(prompts, GREEDY)) == want  # warm: loads from the host
    s = e.stats()
    assert s["demoted_pages"] > 0 and s["loaded_pages"] > 0, s
    assert s["preemptions"] > 0, s
    assert s["bytes_from_host"] == s["loaded_pages"] * e.pool.page_bytes
    assert s["bytes_to_host"] == s["demoted_pages"] * e.pool.page_bytes
    # the copies ran layer by layer inside the forwards (host_copies.py), not all before them
    assert e.pool.copier.forward_layers > 0
    assert_no_leak(e)
    return e


@pytest.mark.parametrize("P", [1, 4, 16])
def test_greedy_after_demote_and_load_back_equals_reuse_off(P):
    _demote_and_load_back(P)


@pytest.mark.parametrize("P", [1, 4])
def test_forks_demoting_pages_under_a_host_tier_equal_reuse_off(P, monkeypatch):
    """n=2: a fork's page allocation may demote; those copies run at once (all layers), after
    the step's layered ones and before the fork copies its pages."""
    from radixray.worker.memory_pool import KVPool

    now, host_copies = [], KVPool.host_copies

    def spy(self, copies, layered=False, wait=False):
        if not layered:
            now.extend(copies)
        return host_copies(self, copies, layered, wait)

    monkeypatch.setattr(KVPool, "host_copies", spy)
    n2 = SamplingParams(n=2, max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = shared_prefix_prompts(seed=3, n=8)
    want = tokens(engine(cache="chunk", page_size=P).generate_batch(prompts, n2))
    # fcfs: running prefills keep the budget, so the forks run short of pages and preempt
    e = engine(page_size=P, num_pages=64 // P, host_pages=400, max_batch_tokens=32,
               prefill_order="fcfs")  # fmt: skip
    assert tokens(e.generate_batch(prompts, n2)) == want
    assert tokens(e.generate_batch(prompts, n2)) == want
    assert now and e.stats()["preemptions"] > 0
    assert_no_leak(e)


@pytest.mark.gpu
@pytest.mark.parametrize("P", [1, 16])
def test_greedy_after_demote_and_load_back_equals_reuse_off_cuda(P, monkeypatch):
    from .test_cuda_graph import record_replays

    record = record_replays(monkeypatch)
    e = _demote_and_load_back(P, "cuda")
    replays = [handed for _, handed, _ in record]  # the last hand-over of copies before each
    assert e.pool.host.k.is_pinned() and e.pool.copier.stream is not None
    # decode steps replayed CUDA graphs, some right after copies handed over whole (the
    # compute stream waits for them); prefill steps ran theirs layer by layer
    assert 0 < len(replays) == e.runner.graphs.replays < e.meter.steps
    assert (True, False) in replays and not any(layered for _, layered in replays)
    assert e.pool.copier.forward_layers > 0


@pytest.mark.gpu
def test_cuda_forward_waits_for_each_layers_copies_just_before_that_layer(monkeypatch):
    """No timing: the copies are queued on the copy stream with one event per layer, and the
    compute stream waits for layer i's event after layer i - 1 started and before layer i."""
    import torch

    from radixray.worker.host_copies import HostCopies

    log: list[tuple] = []
    stage, wait = HostCopies.stage, torch.cuda.Stream.wait_event

    def staged(self, copies):
        stage(self, copies)
        log.append(("stage", [t if isinstance(t, torch.cuda.Event) else None for t in self._todo]))

    def waited(self, event):
        log.append(("wait", self, event))
        return wait(self, event)

    monkeypatch.setattr(HostCopies, "stage", staged)
    monkeypatch.setattr(torch.cuda.Stream, "wait_event", waited)
    # eager steps only: a replayed decode step waits for all its copies first (test_cuda_graph)
    kw = {"num_pages": 32, "host_pages": 400, "max_batch_tokens": 32, "cuda_graph_max_batch": 0}
    e = engine(page_size=4, device="cuda", **kw)
    for i, layer in enumerate(e.runner.model.layers):
        layer.register_forward_pre_hook(lambda m, a, i=i: log.append(("layer", i)))
    e.generate_batch(shared_prefix_prompts(seed=4, n=10), GREEDY)
    e.generate_batch(shared_prefix_prompts(seed=4, n=10), GREEDY)
    assert e.stats()["loaded_pages"] > 0
    stages = [k for k, x in enumerate(log) if x[0] == "stage"]
    assert stages
    for k in stages:
        events, layer = log[k][1], -1
        assert any(ev is not None for ev in events)
        for x in log[k + 1 :]:
            if x[0] == "stage" or (x[0] == "layer" and x[1] <= layer):
                break  # the next step
            if x[0] == "layer":
                layer = x[1]
            elif x[0] == "wait" and x[2] in events:
                i = events.index(x[2])
                assert i == layer + 1, (i, layer)  # after layer i - 1 began, before layer i
                assert x[1] != e.pool.copier.stream  # the compute stream waits
                events[i] = None
        assert all(ev is None for ev in events), "a layer's copies not awaited before it"


def test_a_demoted_prompt_is_loaded_back_not_recomputed():
    P = 16
    p = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    e = engine(page_size=P, num_pages=12, host_pages=64)
    prompt = list(range(3, 20))  # one reusable page and a one-token tail
    first = e.generate_batch([prompt], p)[0]
    assert first.miss["cold"] == 16
    for i in range(6):  # push it out of the device pool
        e.generate_batch([[50 + i] * 33], p)
    assert e.cache.match_prefix(prompt).host_tokens == 16
    again = e.generate_batch([prompt], p)[0]
    assert again.miss["host"] == 16 and again.miss["cached"] == 0 and again.miss["evicted"] == 0
    assert again.cached_tokens == 16  # device hits plus host loads
    assert again.token_ids == first.token_ids
    view = e.stats()
    assert view["loaded_pages"] == 1 and view["cached_tokens"] >= 16
    host = cache_view(*e.report())["host"]  # what /debug/cache shows
    assert host["loaded_pages"] == 1 and host["total_pages"] == 64
    assert host["bytes_from_host"] == e.pool.page_bytes and host["demoted_pages"] >= 1
    assert_no_leak(e)


def test_evicted_means_gone_from_both_tiers():
    P = 16
    p = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    e = engine(page_size=P, num_pages=12, host_pages=2)
    prompt = list(range(3, 20))
    e.generate_batch([prompt], p)
    for i in range(6):
        e.generate_batch([[50 + i] * 33], p)
    again = e.generate_batch([prompt], p)[0]
    assert again.miss["evicted"] == 16 and again.miss["host"] == 0
    assert e.stats()["host_evicted_pages"] > 0
    assert_no_leak(e)


def test_host_pages_config():
    assert engine().pool.host_allocator is None  # None on the CPU: no host tier
    assert engine(host_pages=0).pool.host_allocator is None
    assert engine(cache="chunk", host_pages=8).pool.host_allocator is None  # nothing to keep
    for bad in (-1, 1.5, True, "8"):
        with pytest.raises(ValueError, match="--host-pages must be an int >= 0"):
            EngineConfig(host_pages=bad)


def test_engine_events_name_the_tier_store_before_remove():
    from radixray.cache_index import BlockRemoved, BlockStored

    P = 16
    p = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    e = engine(page_size=P, num_pages=12, host_pages=64)
    prompt = list(range(3, 20))
    e.generate_batch([prompt], p)
    for i in range(6):
        e.generate_batch([[50 + i] * 33], p)
    e.generate_batch([prompt], p)  # loaded back
    events = e.take_events()
    seen: dict[tuple, int] = {}
    for i, ev in enumerate(events):
        if isinstance(ev, (BlockStored, BlockRemoved)):
            for h in ev.block_hashes:
                seen.setdefault((type(ev).__name__, ev.medium, h), i)
    assert e.cache.match_prefix(prompt).num_tokens == 16  # device-resident again
    demoted = [k[2] for k in seen if k[:2] == ("BlockStored", "CPU")]
    assert demoted
    for h in demoted:  # each demotion: the host store before the device remove
        assert seen[("BlockStored", "CPU", h)] < seen[("BlockRemoved", "GPU", h)]
    assert not any(k[:2] == ("BlockRemoved", "CPU") for k in seen)  # the host kept everything


def test_a_tier_with_nothing_to_move_costs_no_copies_and_no_events(monkeypatch):
    """A pool that never fills: no step stages a copy, the copier's finish has nothing to do,
    and the events are the plain device stores a tierless engine sends, no host one."""
    from radixray.cache_index import BlockStored
    from radixray.worker.host_copies import HostCopies

    staged = []
    stage = HostCopies.stage
    monkeypatch.setattr(HostCopies, "stage", lambda self, c: (staged.append(c), stage(self, c)))
    prompts = shared_prefix_prompts(seed=5, n=4)
    plain = engine(page_size=4, num_pages=256, host_pages=0)
    e = engine(page_size=4, num_pages=256, host_pages=64)
    assert tokens(e.generate_batch(prompts, GREEDY)) == tokens(
        plain.generate_batch(prompts, GREEDY)
    )
    assert staged == [] and e.pool.copier.finish() == ([], 0.0)
    s = e.stats()
    assert s["demoted_pages"] == s["loaded_pages"] == 0 and s["copy_seconds"] == 0.0
    assert s["bytes_to_host"] == s["bytes_from_host"] == 0
    events, want = e.take_events(), plain.take_events()
    assert all(ev.medium == "GPU" for ev in events if isinstance(ev, BlockStored))
    assert [type(ev).__name__ for ev in events] == [type(ev).__name__ for ev in want]
    assert_no_leak(e)
