"""Decode steps replayed from CUDA graphs: the whole forward in one launch.

A decode step's forward is ~38 small kernels a layer (norms, rotary, projections, attention).
On CUDA, Python and the launches cost more than the kernels: the first GPU run measured 1,157
launches and ~30 ms per step of SmolLM2 at any batch size, the GPU busy ~2.5 ms of it
(benchmarks/README.md, "First GPU run"). A graph captured once per batch size replays the same
kernels with no Python in between, as SGLang's and vLLM's decode does.

A graph fixes its tensors' addresses and shapes, so a decode step runs on static buffers:

- the batch is rounded up to the next captured size (1, 2, 4, 8, then multiples of 8); a padding
  row reads one token of page 0 and stores nothing (slot -1), and its logits are dropped;
- the block table is as wide as the longest context (``max_model_len``): the decode kernel's
  split count, chosen from that width, is the same on every replay.

Only pure decode steps replay (every item one token that samples); the host tier's copies for a
step that replays run before it, not by layer (``ModelRunner.replays``). Prefill chunks, models
whose forward reads device values on the host (a sparse MoE's routing counts, soft-capped
attention), sliding-window pools and models with recurrent-state layers (their per-sequence
state slots and prefill-or-decode split are not captured) run eagerly. ``capture=False`` runs
the padded forward eagerly: the CPU tests' way to check the padding, which a graph then replays
unchanged.
"""

from __future__ import annotations

import logging
import time

import torch

from .model.attention import AttentionMetadata

__all__ = ["DecodeGraphs", "batch_sizes", "graph_unsupported"]

log = logging.getLogger(__name__)


def batch_sizes(max_batch: int) -> list[int]:
    """The captured batch sizes: 1, 2, 4, 8, then every multiple of 8 up to ``max_batch``
    (rounded up to one), SGLang's ladder: padding costs at most 7 rows past 8."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    ladder = [1, 2, 4, *range(8, max_batch + 8, 8)]
    return [s for s in ladder if s < max_batch] + [next(s for s in ladder if s >= max_batch)]


def graph_unsupported(model, pool) -> str | None:
    """Why a decode step of this model on this pool cannot be captured, or None."""
    cfg = model.config
    if cfg.state_layers:  # hybrids decode eagerly (docs/models.md)
        return "state layers (conv/mamba) run eagerly: their slots are no graph's static buffers"
    if pool.window_k is not None:
        return "the pool has a sliding-window part (its block tables change shape per step)"
    if cfg.attn_logit_softcap is not None:
        return "soft-capped attention reads its lengths on the host"
    if cfg.num_experts:
        return "a sparse MoE counts its routed tokens on the host"
    return None


class DecodeGraphs:
    """CUDA graphs of ``model``'s decode forward on ``pool``, one per size of :func:`batch_sizes`,
    all captured by :meth:`capture` before the first step (the model runner's start-up)."""

    def __init__(self, model, pool, max_batch: int, max_model_len: int, capture: bool = True):
        self.model, self.pool, self.capture_graphs = model, pool, capture
        self.sizes = batch_sizes(max_batch)
        B, P = self.sizes[-1], pool.page_size
        self.width = -(-max_model_len // P)  # pages of the longest context
        dev = pool.k_cache.device
        # one int64 buffer for ids, positions and slots: one host-to-device copy a step
        self.vec = torch.zeros(3, B, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(B, dtype=torch.int32, device=dev)
        self.block_table = torch.zeros(B, self.width, dtype=torch.int32, device=dev)
        self.cu_seqlens_q = torch.arange(B + 1, dtype=torch.int32, device=dev)
        self.vec[2].fill_(-1)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._mempool = None
        self.replays = 0  # decode steps served by a graph (or by the padded eager forward)

    def fits(self, batch) -> bool:
        """A pure decode step this can run: every item one sampled token, within the sizes and
        the block table's width."""
        items = batch.items
        if not items or len(items) > self.sizes[-1]:
            return False
        P, W = self.pool.page_size, self.width
        return all(it.num_tokens == 1 and it.sample and it.start < W * P for it in items)

    def run(self, rows, fix=None) -> torch.Tensor:
        """Logits ``[n, vocab]`` (float32) of a decode step's ``n`` rows (``Batch.decode_rows``),
        in order. ``fix``: (rows, ids) on the device, the ids of rows whose token the host has
        not read (``ModelRunner.prepare``)."""
        n = len(rows.ids)
        size = next(s for s in self.sizes if s >= n)
        self._fill(rows, size)
        if fix is not None:
            self.vec[0].index_copy_(0, *fix)
        self.replays += 1
        if not self.capture_graphs:
            return self._forward(size)[:n]
        graph, logits = self.graphs[size]
        graph.replay()
        # the next replay (of any size: they share one memory pool) overwrites the output
        return logits[:n].clone()

    def capture(self) -> float:
        """Capture every size's graph not captured yet; the seconds it took. Before the first
        step the buffers' rows are all padding: the warm-up forwards store nothing."""
        todo = [s for s in self.sizes if s not in self.graphs]
        if not todo or not self.capture_graphs:
            return 0.0
        t0 = time.perf_counter()
        if self._mempool is None:
            self._mempool = torch.cuda.graph_pool_handle()
        # largest first: the smaller graphs' temporaries fit in what the larger ones freed
        for size in sorted(todo, reverse=True):
            side = torch.cuda.Stream()  # warm-up off the capture (torch's recipe): Triton
            side.wait_stream(torch.cuda.current_stream())  # compiles, the allocator settles
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._forward(size)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._mempool):
                logits = self._forward(size)
            self.graphs[size] = (graph, logits)
        seconds = time.perf_counter() - t0
        log.info("captured %d decode graphs (batch %s) in %.2f s", len(todo), todo, seconds)
        return seconds

    def _fill(self, rows, size: int) -> None:
        """The step's rows into the static buffers; rows past ``n`` become padding."""
        pad = size - len(rows.ids)
        ids, pos = rows.ids + [0] * pad, rows.positions + [0] * pad
        slots, lens = rows.slots + [-1] * pad, [p + 1 for p in rows.positions] + [1] * pad
        width = rows.width
        # from pinned memory, not waiting for the device (model/upload.py)
        pin = self.vec.is_cuda
        table = [r + [0] * (width - len(r)) for r in rows.pages + [[0]] * pad]
        table = torch.tensor(table, dtype=torch.int32, pin_memory=pin)
        vec = torch.tensor([ids, pos, slots], dtype=torch.int64, pin_memory=pin)
        self.vec[:, :size].copy_(vec, non_blocking=True)
        self.seq_lens[:size].copy_(torch.tensor(lens, dtype=torch.int32, pin_memory=pin), True)
        # columns past ``width`` keep older page ids: a row reads only its own pages
        self.block_table[:size, :width].copy_(table, non_blocking=True)

    def _forward(self, size: int) -> torch.Tensor:
        meta = AttentionMetadata(
            slot_mapping=self.vec[2, :size],
            block_table=self.block_table[:size],
            cu_seqlens_q=self.cu_seqlens_q[: size + 1],
            seq_lens=self.seq_lens[:size],
            max_seqlen_q=1,
        )
        k, v = self.pool.k_cache, self.pool.v_cache
        return self.model(self.vec[0, :size], self.vec[1, :size], meta, k, v)
