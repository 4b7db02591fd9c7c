"""The host tier's K/V and the copies between it and the device pool, run layer by layer
(docs/host_tier.md, "How copies run").

    host k, v: [layers, host_pages, page_size, num_kv_heads, head_dim]

Layer-first, as the device pool: a run of consecutive pages of one layer is one contiguous
block on both sides, so each (layer, run, K or V) is one plain copy (one DMA on CUDA).

The cache records a step's copies (``host_tier.PageCopy``: demotions and load-backs, in
order); ``HostCopies.stage`` splits them by layer and the forward calls ``before_layer(i)``
just before layer ``i`` reads or writes its KV:

- on CUDA, ``stage`` queues every layer's copies on the copy stream at once (after the compute
  stream's earlier work: a demotion reads pages earlier steps wrote), recording an event after
  each layer's; ``before_layer(i)`` makes the compute stream wait for layer ``i``'s event. So
  layer ``i``'s copies overlap the compute of layers ``< i``: a demoted page's layer ``i`` is
  read before layer ``i`` writes the reused page, a loaded page's layer ``i`` is in place
  before layer ``i``'s attention reads it;
- on the CPU, ``before_layer(i)`` runs layer ``i``'s copies there and then (plain copies, no
  concurrency, the same split).

``finish`` completes whatever is staged (the layers the forward did not reach; on CUDA the
compute stream waits for all of it) and returns what was copied, for the counters. On CUDA it
never waits for the copy stream: a batch's time is read from its timing events once its end
event's ``query()`` says the copies are done, by a later step's ``finish`` (or one asked to
``wait``, which the engine does when it goes idle). With nothing staged and nothing pending
it does nothing.
"""

from __future__ import annotations

import math
import mmap
import time
from typing import NamedTuple

import torch

__all__ = ["HostKV", "HostCopies", "Copied", "cpu_zeros"]


class Copied(NamedTuple):
    """One staged batch of copies, done: the cache's ``PageCopy`` list, the bytes it moved and
    the seconds the copies took (CUDA: on the copy stream; CPU: on the host thread)."""

    copies: list
    moved: int
    seconds: float


def cpu_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed CPU tensor from an anonymous memory map, which the kernel hands out as zero
    pages on first touch (``torch.zeros`` writes every byte up front). The tensor holds the map
    alive; frombuffer shares its memory."""
    nbytes = torch.empty((), dtype=dtype).element_size() * math.prod(shape)
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    buf = mmap.mmap(-1, nbytes)  # MAP_ANONYMOUS | MAP_PRIVATE: zero-filled by the kernel
    return torch.frombuffer(buf, dtype=dtype).view(shape)


class HostKV:
    """The host K and V behind one device pool (``k_cache``, ``v_cache``: ``[layers, pages, P,
    Hkv, D]``): pinned on CUDA (the copies are DMA, asynchronous to the host thread)."""

    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor, host_pages: int):
        L, _, P, H, D = k_cache.shape
        shape = (L, host_pages, P, H, D)
        self.device = k_cache.device
        self.dev = (k_cache, v_cache)
        self.cuda = self.device.type == "cuda"
        if self.cuda:
            self.k = torch.zeros(shape, dtype=k_cache.dtype, pin_memory=True)
            self.v = torch.zeros(shape, dtype=k_cache.dtype, pin_memory=True)
        else:
            self.k = cpu_zeros(shape, k_cache.dtype)
            self.v = cpu_zeros(shape, k_cache.dtype)
        self.page_bytes = 2 * math.prod(shape[0:1] + shape[2:]) * self.k.element_size()

    def copy_layer(self, layer: int, plan: list[tuple[bool, list[tuple[int, int, int]]]]) -> None:
        """Layer ``layer``'s K and V of each copy in ``plan`` (``(to_host, runs)``, in order; a
        run is ``(src_start, dst_start, length)``): one slice copy per run."""
        nb = self.cuda
        for to_host, runs in plan:
            for dev, host in zip(self.dev, (self.k, self.v), strict=True):
                d, h = dev[layer], host[layer]
                for s0, d0, n in runs:
                    if to_host:
                        h[d0 : d0 + n].copy_(d[s0 : s0 + n], non_blocking=nb)
                    else:
                        d[d0 : d0 + n].copy_(h[s0 : s0 + n], non_blocking=nb)

    def copy_out(self, src: list[int], dst: list[int]) -> None:
        """Device pages ``src`` -> host pages ``dst``, every layer, now (on the current stream)."""
        for layer in range(self.k.shape[0]):
            self.copy_layer(layer, [(True, runs(src, dst))])

    def copy_in(self, src: list[int], dst: list[int]) -> None:
        """Host pages ``src`` -> device pages ``dst``, every layer, now."""
        for layer in range(self.k.shape[0]):
            self.copy_layer(layer, [(False, runs(src, dst))])


class HostCopies:
    """Runs the cache's recorded copies for a pool, layer by layer (see the module's doc).

    ``layer_slots[i]``: where model layer ``i`` keeps its KV (``(in the window pool, index)``,
    ``KVPool.layer_slots``); ``host`` the full pool's host K/V, ``host_window`` the window
    pool's (or None). Single-threaded, as the engine."""

    def __init__(self, layer_slots, host: HostKV, host_window: HostKV | None = None):
        self.layer_slots = list(layer_slots)
        self.hosts = (host, host_window)
        self.stream = torch.cuda.Stream(host.device) if host.cuda else None
        self._staged: list | None = None  # the staged batch: Copied's first two fields
        self._todo: list = []  # per model layer: the plan to run (CPU), the event to wait for
        # (CUDA), or None (nothing left)
        self._timing: tuple | None = None  # CUDA: (start, end) events of the staged batch
        # CUDA: batches done on the host thread's side, their copies maybe still running:
        # (copies, moved, start, end), read once ``end.query()`` says so (no sync per step)
        self._pending: list[tuple] = []
        self._compute = None  # CUDA: the stream the forward runs on
        self._events = [None] * len(self.layer_slots)  # CUDA: one per layer, reused
        self.held = 0.0  # seconds spent in before_layer since the last finish
        self.forward_layers = 0  # layers whose copies a forward's before_layer ran or awaited

    def stage(self, copies) -> None:
        """Split ``copies`` by layer; run (CPU) or queue (CUDA) them by ``before_layer``."""
        if self._staged is not None:
            raise RuntimeError("copies are already staged: finish() them first")
        full = [(c.to_host, runs(c.src, c.dst)) for c in copies if not c.window]
        win = [(c.to_host, runs(c.src, c.dst)) for c in copies if c.window]
        moved = sum(len(c.src) for c in copies if not c.window) * self.hosts[0].page_bytes
        if win:
            moved += sum(len(c.src) for c in copies if c.window) * self.hosts[1].page_bytes
        self._staged = [copies, moved]
        self._todo = [(win if w else full) or None for w, _ in self.layer_slots]
        if self.stream is None:
            return
        compute = self._compute = torch.cuda.current_stream(self.hosts[0].device)
        self.stream.wait_stream(compute)  # pages a demotion reads were written by earlier steps
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.stream):
            start.record()
            for i, plan in enumerate(self._todo):
                if plan is not None:
                    in_window, slot = self.layer_slots[i]
                    self.hosts[in_window].copy_layer(slot, plan)
                    event = self._events[i] = self._events[i] or torch.cuda.Event()
                    event.record()
                    self._todo[i] = event
            end.record()
        self._timing = (start, end)

    def staged(self) -> bool:
        """Copies wait for the next forward's ``before_layer`` calls."""
        return any(t is not None for t in self._todo)

    def before_layer(self, i: int) -> None:
        """Layer ``i`` is about to read and write its KV: its copies must be done."""
        if self._todo and self._todo[i] is not None:
            t0 = time.perf_counter()
            self.forward_layers += 1
            self._layer(i)
            self.held += time.perf_counter() - t0

    def _layer(self, i: int) -> None:
        todo = self._todo[i]  # None, a plan (CPU) or an event (CUDA)
        if todo is None:
            return
        self._todo[i] = None
        if self.stream is not None:
            self._compute.wait_event(todo)
            return
        in_window, slot = self.layer_slots[i]
        self.hosts[in_window].copy_layer(slot, todo)

    def finish(self, wait: bool = False) -> tuple[list[Copied], float]:
        """Complete the staged batch (every layer ``before_layer`` did not reach). Returns the
        batches whose copies are done (CPU: the staged one, now; CUDA: those the copy stream
        has finished, read without waiting unless ``wait``: a batch still running comes back
        from a later call) and the seconds ``before_layer`` took since the last finish (the
        forward's time that was copies). Nothing staged and nothing pending: no work at all."""
        held, self.held = self.held, 0.0
        if self._staged is None:
            return (self._done(wait) if self._pending else []), held
        t0 = time.perf_counter()
        for i in range(len(self._todo)):
            self._layer(i)
        copies, moved = self._staged
        self._staged, self._todo = None, []
        if self.stream is None:  # every copy ran on this thread: in the forward or just now
            return [Copied(copies, moved, held + time.perf_counter() - t0)], held
        start, end = self._timing
        self._compute.wait_event(end)  # whatever the compute stream runs next sees them
        self._timing = self._compute = None
        self._pending.append((copies, moved, start, end))
        return self._done(wait), held

    def _done(self, wait: bool = False) -> list[Copied]:
        """CUDA: the pending batches whose copies have finished (all of them, after waiting for
        the last, if ``wait``), in order: the copy stream runs them in order, so the first one
        still running ends the list."""
        if wait and self._pending:
            self._pending[-1][3].synchronize()
        out = []
        while self._pending and self._pending[0][3].query():
            copies, moved, start, end = self._pending.pop(0)
            out.append(Copied(copies, moved, start.elapsed_time(end) / 1e3))
        return out

    def run(self, copies) -> int:
        """Run ``copies`` now, every layer, after anything staged (not counted); the bytes
        moved. The batches pending before it stay pending (counted by the caller's finish)."""
        pending, self._pending = self._pending, []
        self.finish()
        self.stage(copies)
        moved = self._staged[1]
        self.finish()
        self._pending = pending
        return moved


def runs(src: list[int], dst: list[int]) -> list[tuple[int, int, int]]:
    """``(src_start, dst_start, length)`` of the maximal runs where both ids go up by one."""
    out: list[tuple[int, int, int]] = []
    for a, b in zip(src, dst, strict=True):
        if out:
            s0, d0, n = out[-1]
            if a == s0 + n and b == d0 + n:
                out[-1] = (s0, d0, n + 1)
                continue
        out.append((a, b, 1))
    return out
