"""The host tier's K/V in the pool: copies of page lists out to the host and back, in order."""

from __future__ import annotations

import pytest
import torch

from radixray.cache_index.host_tier import PageCopy
from radixray.worker.host_copies import HostCopies
from radixray.worker.memory_pool import KVPool


def _pool(device: str, host_pages: int = 6) -> KVPool:
    pool = KVPool(2, 5, 4, 2, 8, torch.float32, device, host_pages)
    g = torch.Generator().manual_seed(0)
    pool.k_cache.copy_(torch.randn(pool.k_cache.shape, generator=g))
    pool.v_cache.copy_(torch.randn(pool.v_cache.shape, generator=g))
    return pool


def _round_trip(device: str) -> None:
    pool = _pool(device)
    k0, v0 = pool.k_cache.clone(), pool.v_cache.clone()
    # page 1 out to host 4, page 3 out to host 0; then device page 1 is reused (overwritten)
    # and host 4 is loaded into device page 2, host 0 into device page 1
    copies = [PageCopy(True, [1, 3], [4, 0]), PageCopy(False, [4, 0], [2, 1])]
    moved = pool.run_copies(copies)
    if device == "cuda":
        torch.cuda.synchronize()
    assert moved == 4 * pool.page_bytes
    assert torch.equal(pool.host.k[:, 4].to(device), k0[:, 1]) and torch.equal(
        pool.host.v[:, 0].to(device), v0[:, 3]
    )
    assert torch.equal(pool.k_cache[:, 2], k0[:, 1]) and torch.equal(pool.v_cache[:, 2], v0[:, 1])
    assert torch.equal(pool.k_cache[:, 1], k0[:, 3]) and torch.equal(pool.v_cache[:, 1], v0[:, 3])
    assert torch.equal(pool.k_cache[:, [0, 3, 4]], k0[:, [0, 3, 4]])  # nothing else written


def test_copies_out_and_back_in_order_cpu():
    _round_trip("cpu")


def test_runs_of_consecutive_pages_copy_as_slices():
    pool = _pool("cpu")
    k0 = pool.k_cache.clone()
    pool.run_copies([PageCopy(True, [0, 1, 2, 4], [2, 3, 4, 0])])
    pool.run_copies([PageCopy(False, [2, 3, 4, 0], [1, 2, 3, 0])])
    assert torch.equal(pool.k_cache[:, [1, 2, 3, 0]], k0[:, [0, 1, 2, 4]])


def test_no_host_tier_means_no_copies():
    pool = KVPool(2, 5, 4, 2, 8)
    assert pool.host is None and pool.host_allocator is None
    assert pool.run_copies([]) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_copies_out_and_back_in_order_cuda():
    _round_trip("cuda")
    assert _pool("cuda").host.k.is_pinned()


def _poisoned(device: str, **window) -> KVPool:
    """Three layers, random device K/V, host K/V all -7 (what no copy writes)."""
    pool = KVPool(3, 6, 4, 2, 8, torch.float32, device, 6, **window)
    g = torch.Generator().manual_seed(1)
    for t in (pool.k_cache, pool.v_cache, pool.window_k, pool.window_v):
        if t is not None:
            t.copy_(torch.randn(t.shape, generator=g))
    for h in (pool.host, pool.host_window):
        if h is not None:
            h.k.fill_(-7.0), h.v.fill_(-7.0)
    return pool


def test_before_layer_copies_exactly_that_layers_slices():
    pool = _poisoned("cpu")
    k0, v0 = pool.k_cache.clone(), pool.v_cache.clone()
    pool.host.k[:, 0] = 5.0  # host page 0: loaded back into device page 1
    # pages 1-2 demoted to host 4-5, then host 0 loaded into the reused device page 1
    copies = [PageCopy(True, [1, 2], [4, 5]), PageCopy(False, [0], [1])]
    assert pool.host_copies(copies, layered=True) == ([], 0.0)
    assert torch.equal(pool.k_cache, k0) and (pool.host.k[:, 4:6] == -7).all()  # staged only
    pool.before_layer(1)
    assert torch.equal(pool.host.k[1, 4:6], k0[1, 1:3]) and torch.equal(
        pool.host.v[1, 4:6], v0[1, 1:3]
    )
    assert (pool.host.k[[0, 2], 4:6] == -7).all() and (pool.host.v[[0, 2], 4:6] == -7).all()
    assert (pool.k_cache[1, 1] == 5).all()  # demoted first, then overwritten by the load
    assert torch.equal(pool.k_cache[[0, 2]], k0[[0, 2]])  # other layers untouched
    pool.before_layer(1)  # once only: layer 1's copies are done
    assert pool.copier.forward_layers == 1
    (done,), _ = pool.host_copies([])  # the layers the forward did not reach, now
    assert done.copies == copies and done.moved == 3 * pool.page_bytes and done.seconds > 0
    assert torch.equal(pool.host.k[:, 4:6], k0[:, 1:3]) and (pool.k_cache[:, 1] == 5).all()
    assert torch.equal(pool.v_cache[:, 1], pool.host.v[:, 0])
    assert pool.copier.forward_layers == 1 and pool.host_copies([]) == ([], 0.0)


def test_window_pool_copies_follow_the_window_layers():
    # model layers 0 and 2 in the full pool (slots 0, 1), layer 1 in the window pool (slot 0)
    pool = _poisoned("cpu", window_layers=(1,), window_pages=4, window=8, host_window_pages=4)
    k0, w0 = pool.k_cache.clone(), pool.window_k.clone()
    copies = [PageCopy(True, [1], [2]), PageCopy(True, [1], [3], window=True)]
    pool.host_copies(copies, layered=True)
    pool.before_layer(1)
    assert torch.equal(pool.host_window.k[0, 3], w0[0, 1])
    assert (pool.host.k == -7).all()  # no full-pool layer copied yet
    pool.before_layer(2)
    assert torch.equal(pool.host.k[1, 2], k0[1, 1]) and (pool.host.k[0] == -7).all()
    (done,), _ = pool.host_copies([])
    assert torch.equal(pool.host.k[0, 2], k0[0, 1])
    assert done.moved == pool.page_bytes + pool.window_page_bytes


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_copies_queue_one_event_per_layer_on_their_stream():
    pool = _poisoned("cuda")
    torch.cuda.synchronize()
    k0 = pool.k_cache.clone()
    copies = [PageCopy(True, [1, 2], [4, 5]), PageCopy(False, [4], [3])]
    pool.host_copies(copies, layered=True)
    events = list(pool.copier._todo)
    assert all(isinstance(e, torch.cuda.Event) for e in events) and len(set(map(id, events))) == 3
    for i in range(3):
        pool.before_layer(i)  # the compute stream waits for layer i's event
        assert pool.copier._todo[i] is None
    done_now, _ = pool.host_copies([])  # done on the host's side: the copies may still run
    torch.cuda.synchronize()
    (done,) = done_now + pool.host_copies([])[0]  # read once they are done, once
    assert all(e.query() for e in events) and done.moved == 3 * pool.page_bytes
    assert torch.equal(pool.host.k[:, 4:6].cuda(), k0[:, 1:3])
    assert torch.equal(pool.k_cache[:, 3], k0[:, 1])  # loaded from host 4, demoted from 1
    assert pool.host.k.is_pinned() and pool.host.v.is_pinned()


class _FakeCuda:
    """Streams and events that log what the copier asks of them (the CUDA protocol, checked on
    the CPU): the tensors stay on the CPU and the copies run when queued."""

    def __init__(self, log: list):
        self.log, self.current = log, "compute"
        self.copied = True  # what an event's query() answers: the copy stream is past it
        fake = self

        class Stream:
            def __init__(self, device=None, name="copy"):
                self.name = name

            def wait_stream(self, other):
                fake.log.append(("wait_stream", self.name, other.name))

            def wait_event(self, event):
                fake.log.append(("wait_event", self.name, event.name))

        class Event:
            made = 0

            def __init__(self, enable_timing=False):
                Event.made += 1
                self.name = f"t{Event.made}" if enable_timing else f"e{Event.made}"

            def record(self, stream=None):
                fake.log.append(("record", self.name, fake.current))

            def synchronize(self):
                fake.log.append(("synchronize", self.name))

            def query(self):
                fake.log.append(("query", self.name))
                return fake.copied

            def elapsed_time(self, end):
                return 2.0  # ms

        class _Use:
            def __init__(self, stream):
                self.stream = stream

            def __enter__(self):
                fake.current = self.stream.name

            def __exit__(self, *exc):
                fake.current = "compute"

        self.Stream, self.Event = Stream, Event
        self.compute = Stream(name="compute")
        self.stream = _Use

    def current_stream(self, device=None):
        return self.compute


def test_cuda_protocol_one_event_per_layer_awaited_before_that_layer(monkeypatch):
    log: list = []
    fake = _FakeCuda(log)
    for name in ("Stream", "Event", "stream", "current_stream"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    # model layer 1 in the window pool: its copies are window copies, the others' full ones
    pool = _poisoned("cpu", window_layers=(1,), window_pages=4, window=8, host_window_pages=4)
    pool.host.cuda = pool.host_window.cuda = True  # the CUDA branch, on CPU tensors
    copier = HostCopies(pool.layer_slots, pool.host, pool.host_window)
    for h in copier.hosts:
        copy_layer = h.copy_layer

        def logged(layer, plan, copy_layer=copy_layer, h=h):
            log.append(("copy", "window" if h is pool.host_window else "full", layer, fake.current))
            copy_layer(layer, plan)

        h.copy_layer = logged
    k0 = pool.k_cache.clone()
    copier.stage([PageCopy(True, [1, 2], [4, 5]), PageCopy(False, [4], [3])])
    assert log == [
        ("wait_stream", "copy", "compute"),  # after the compute stream's earlier work
        ("record", "t1", "copy"),
        ("copy", "full", 0, "copy"),
        ("record", "e3", "copy"),
        ("copy", "full", 1, "copy"),  # model layer 2 (layer 1 has no window copies)
        ("record", "e4", "copy"),
        ("record", "t2", "copy"),
    ]
    del log[:]
    for i in range(3):
        copier.before_layer(i)
        log.append(("layer", i))
    assert log == [
        ("wait_event", "compute", "e3"),
        ("layer", 0),
        ("layer", 1),
        ("wait_event", "compute", "e4"),
        ("layer", 2),
    ]
    del log[:]
    fake.copied = False  # the copy stream is still at it: nothing to count yet, no waiting
    assert copier.finish()[0] == []
    assert log == [("wait_event", "compute", "t2"), ("query", "t2")]
    del log[:]
    assert copier.finish()[0] == [] and log == [("query", "t2")]
    fake.copied = True
    del log[:]
    (done,), held = copier.finish()  # a later step reads the timing, the host never synced
    assert log == [("query", "t2")]
    assert done.seconds == 0.002 and done.moved == 3 * pool.page_bytes and held >= 0
    del log[:]
    assert copier.finish() == ([], 0.0) and log == []  # nothing staged or pending: no work
    assert torch.equal(pool.k_cache[:, 3], k0[:, 1]) and torch.equal(
        pool.host.k[:, 4:6], k0[:, 1:3]
    )
    del log[:]
    copier.stage([PageCopy(True, [0], [0])])  # the next step reuses each layer's event
    assert [x[1] for x in log if x[0] == "record"] == ["t5", "e3", "e4", "t6"]
