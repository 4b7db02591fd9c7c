"""The one place that turns a scheduled batch into tensors and calls the model.

A model with recurrent-state layers also gets each step's ``StateBatch``: every item's state
slot, in batch order (model/state_metadata.py). The runner keeps a ledger of what each slot
holds (which request, the state after how many of its tokens), written as it runs steps and
forks, and refuses a step in which a sequence would resume from KV it has without the state
that goes with it: a prefix cache, a host tier or a fork that left KV but no state behind
would otherwise be computed on silently, with a wrong state.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import torch

from radixray.kernels import make_backend

from .batch import DecodeRows
from .cuda_graph import DecodeGraphs, graph_unsupported
from .decode_inputs import DecodeInputs
from .fused import fuse_activations, fuse_norms, fuse_rope
from .memory_pool import KVPool
from .model.attention import AttentionMetadata, WindowKV
from .model.state_metadata import StateBatch, StateMetadata
from .model.upload import upload
from .request import Request
from .scheduler import Batch
from .state_pool import StatePool

__all__ = ["ModelRunner", "Prepared", "load_for_engine", "resolve_device"]

from .memory_pool import DTYPES as _DTYPES

log = logging.getLogger(__name__)


class Prepared(NamedTuple):
    """A step's inputs as ``ModelRunner.prepare`` built them on the host."""

    batch: Batch
    graphs: bool  # a decode graph replays it (it fills its own static buffers)
    input_ids: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    meta: AttentionMetadata | None = None
    window: WindowKV | None = None
    logits_indices: torch.Tensor | None = None
    spans: list = []  # (request, first position, rows) of prompt logits, after the sampled rows
    num_rows: int = 0  # sampled rows
    # input rows, their rows of the previous step's ids (None: the same rows, every one)
    fix: tuple[list[int], list[int] | None] | None = None
    rows: DecodeRows | None = None  # a graph replay's rows (``Batch.decode_rows``)
    state: StateBatch | None = None  # the state layers' slots (a hybrid model's)


def load_for_engine(config, device: torch.device):
    """(model, model_config, tokenizer) for an EngineConfig."""
    from .model.loader import load_model

    return load_model(config.model, device=device, dtype=_DTYPES[config.dtype], seed=config.seed)


class ModelRunner:
    def __init__(
        self,
        model,
        pool: KVPool,
        device: torch.device,
        backend: str | None = None,
        state: StatePool | None = None,
    ):
        self.model = model
        self.pool = pool
        self.state = state  # the state pool, for a model with recurrent-state layers
        # slot -> (the request whose state it holds, after how many of its tokens)
        self._state_at: dict[int, tuple[Request, int]] = {}
        # The last step's prompt logits (requests with prompt_logprobs): one row per prompt
        # position q whose next token is a prompt token, (request, first q, rows) per item.
        self.prompt_logits: list[tuple[object, int, torch.Tensor]] = []
        self.device = device
        # Chosen once, for this pool: a named backend that cannot run fails here, at start-up,
        # with the reason and the valid choices, not on the first request.
        self.attention = make_backend(
            backend, device, pool.k_cache.dtype, pool.page_size, pool.k_cache.shape[-1]
        )
        model.set_attention_backend(self.attention)
        self.fused_norms = fuse_norms(model, device)  # why not, or None: fused on this device
        self.fused_act = fuse_activations(model, device)  # (likewise: kernels/triton_act.py)
        self.fused_rope = fuse_rope(model, device)  # (likewise: kernels/triton_rope_store.py)
        self.graphs: DecodeGraphs | None = None  # use_graphs: decode steps replay CUDA graphs
        self.graphs_off: str | None = None  # why decode steps run eagerly, when they do
        pages = pool.k_cache.shape[1]
        self.decode_inputs = DecodeInputs(pool.page_size, pages, device)  # one copy a step

    def use_graphs(self, max_batch: int, max_model_len: int, capture: bool = True) -> None:
        """Decode steps of up to ``max_batch`` requests replay CUDA graphs, captured now (on CUDA
        with the Triton backend; elsewhere they stay eager and ``graphs_off`` says why).
        ``capture=False``: the graphs' padded static-buffer forward, run eagerly (any device)."""
        why = graph_unsupported(self.model, self.pool)
        if max_batch < 1:
            why = "off (cuda_graph_max_batch 0)"
        elif capture and self.device.type != "cuda":
            why = f"no CUDA ({self.device.type})"
        elif capture and self.attention.name != "triton":
            why = f"the {self.attention.name} backend is not checked under capture"
        self.graphs_off = why
        if why is not None:
            self.graphs = None
            return
        self.graphs = DecodeGraphs(self.model, self.pool, max_batch, max_model_len, capture)
        try:
            self.graphs.capture()
        except Exception as e:  # serve eagerly rather than not at all; the log says why
            log.warning("decode CUDA graphs off: capture failed: %s: %s", type(e).__name__, e)
            self.graphs, self.graphs_off = None, f"capture failed: {type(e).__name__}: {e}"

    def replays(self, batch: Batch) -> bool:
        """``batch`` will replay a decode graph: one launch, no layer boundaries, so the host
        tier's copies for it must be done before it starts, not staged by layer."""
        return self.graphs is not None and self.graphs.fits(batch)

    def run(self, batch: Batch) -> torch.Tensor:
        """Forward one flat batch; return logits [num sampled items, vocab] (float32), rows in
        the order of the items whose ``sample`` is set."""
        return self.forward(self.prepare(batch))

    def prepare(self, batch: Batch, pending_rows: dict[int, int] | None = None) -> Prepared:
        """The step's inputs, built on the host (``forward`` runs them). A request whose last
        token is still on the device (``Request.pending``) gets a placeholder id and its row in
        ``pending_rows`` (by ``id(request)``: its row of the previous step's sampled ids), which
        ``forward`` copies in on the device."""
        P = self.pool.page_size
        items = batch.items
        state = None
        if self.state is not None or batch.state_copies:
            self._state_copies(batch.state_copies)  # checkpoints saved and restored, then:
            state = self._state(items, batch.state_copies)  # checked first: nothing built if stale
        if self.replays(batch):  # the graphs' own buffers take the rows
            rows = batch.decode_rows(P)
            return Prepared(batch, True, rows=rows, fix=self._fix(batch, rows, pending_rows))
        if self.pool.window_k is None:  # a decode step's own path, if it is one
            decode = self._prepare_decode(batch, pending_rows, state)
            if decode is not None:
                return decode
        fix_dst, fix_src = [], []
        tables, cached, new = [], [], []
        for it in items:
            end = it.start + it.num_tokens
            tables.append(it.req.pages[: -(-end // P)])
            cached.append(it.start)
            new.append(it.num_tokens)
        meta, positions = AttentionMetadata.build(tables, cached, new, P, self.device)
        window = self._window_kv(tables, cached, new)
        ids: list[int] = []
        for it in items:
            req = it.req
            ids += req.token_ids(it.start, it.start + it.num_tokens)
            if req.pending and it.start + it.num_tokens > req.num_prompt + len(req.output_ids):
                fix_dst.append(len(ids))  # a decode of the token the last step sampled
                fix_src.append(pending_rows[id(req)])
                ids.append(0)
        input_ids = upload(ids, torch.int64, self.device)
        rows = [i for i, it in enumerate(items) if it.sample]
        logits_indices = meta.last_token_indices()[rows]
        spans, extra, offset = [], [], 0
        for it, n in zip(items, new, strict=True):
            # position q's logits give token q + 1: a prompt token while q + 1 < num_prompt
            end = min(it.start + n, it.req.num_prompt - 1)
            if it.req.params.prompt_logprobs is not None and it.start < end:
                spans.append((it.req, it.start, end - it.start))
                extra += range(offset, offset + end - it.start)
            offset += n
        if extra:
            logits_indices = torch.cat((logits_indices, upload(extra, torch.int64, self.device)))
        return Prepared(
            batch,
            False,
            input_ids,
            positions,
            meta,
            window,
            logits_indices,
            spans,
            len(rows),
            (fix_dst, fix_src) if fix_dst else None,
            state=state,
        )

    @staticmethod
    def _fix(batch: Batch, rows, pending_rows: dict[int, int] | None):
        """(input rows, previous step's rows) of a decode step's tokens still on the device;
        the latter None when every row is its own row of the previous step (no request ended or
        joined in between: the previous step's ids are the inputs as they are, no gather)."""
        dst = rows.on_device
        if not dst:
            return None
        src = [pending_rows[id(batch.items[i].req)] for i in dst]
        if len(dst) == len(pending_rows) == len(batch.items) and src == list(range(len(dst))):
            return dst, None  # every row is the previous step's same row (the steady state)
        return dst, src

    def _prepare_decode(self, batch: Batch, pending_rows: dict[int, int] | None, state):
        """``prepare`` for a step of one sampled token per item (a decode step), else None:
        ids, positions, slots, lengths and block table in one host tensor and one copy
        (``decode_inputs.py``; the general path builds each from lists of lists)."""
        step = self.decode_inputs.build(batch.items)
        if step is None:
            return None
        fix = self._fix(batch, step, pending_rows)
        m = len(batch.items)
        return Prepared(
            batch,
            False,
            step.ids,
            step.positions,
            step.meta,
            None,
            step.every,
            [],
            m,
            fix,
            state=state,
        )

    def forward(self, prep: Prepared, pending_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Run ``prepare``'s inputs: logits [sampled items, vocab] (float32). ``pending_ids``:
        the previous step's sampled ids, for the rows ``prepare`` left to the device.

        Not in inference mode itself: the model's forward is (and a graph's replay records
        nothing); around it run only copies into the step's own and the pools' tensors and views
        of the logits, which need no autograd state, and entering the mode here cost ~15 us of
        a decode step's host time on the CPU."""
        fix, ids = None, prep.input_ids
        if prep.fix is not None and prep.fix[1] is None:  # the previous step's ids, as they are
            if prep.graphs:
                fix = (self.decode_inputs.rows(len(prep.fix[0])), pending_ids.to(self.device))
            else:
                ids = pending_ids.to(self.device)  # (no copy: a torch op less)
        elif prep.fix is not None:
            dst, src = upload(list(prep.fix), torch.int64, self.device)  # one transfer
            fix = (dst, pending_ids.to(self.device).index_select(0, src))
        if prep.graphs:
            self.prompt_logits = []
            return self.graphs.run(prep.rows, fix)
        if fix is not None:
            ids.index_copy_(0, *fix)
        if prep.batch.state_copies:  # before the forward, in the device's order of steps
            self.state.run_copies(_before(prep.batch.state_copies))
        logits = self.model(
            ids,
            prep.positions,
            prep.meta,
            self.pool.k_cache,
            self.pool.v_cache,
            prep.logits_indices,
            window=prep.window,
            before_layer=self.pool.before_layer if self.pool.copier is not None else None,
            state=prep.state,
        )
        logits = logits if logits.dtype == torch.float32 else logits.float()  # (a call less)
        self.prompt_logits = []
        at = prep.num_rows
        for req, start, n in prep.spans:
            self.prompt_logits.append((req, start, logits[at : at + n]))
            at += n
        return logits[: prep.num_rows] if prep.spans else logits

    def _state(self, items, copies=()) -> StateBatch | None:
        """The step's state inputs (None without state layers), after checking each item against
        the ledger: an item that starts past its first token must find in its slot the state
        after exactly its ``start`` tokens, run into that slot by this request's own earlier
        steps (or copied there by ``fork_state``). Raises AssertionError otherwise: with reuse
        off nothing else can put a state in a slot, so a request admitted with cached KV (a
        prefix cache, a host tier) would be computed on from a stale state. The ``inside``
        saves of ``copies`` go to their items' spans (``StateMetadata.build`` checks each is
        inside its chunk), and the ledger records each destination as a checkpoint after that
        many tokens; those of a request not in ``items`` (it ended before the step ran, and its
        checkpoints with it) are not written."""
        if self.state is None:
            return None
        inside: dict[int, list[tuple[int, int]]] = {}
        for c in copies:
            if c.inside:
                if c.src != c.req.state_slot:
                    raise AssertionError(
                        f"{c.req.request_id}: an in-forward save reads its own slot "
                        f"{c.req.state_slot}, got {c.src}"
                    )
                inside.setdefault(id(c.req), []).append((c.tokens, c.dst))
        ledger, slots, cached, new = self._state_at, [], [], []
        saves = [inside.get(id(it.req), ()) for it in items]
        for at in saves:
            for tokens, dst in at:
                ledger[dst] = (None, tokens)  # a checkpoint, once this step has run
        for it in items:
            req, slot = it.req, it.req.state_slot
            if slot is None:
                raise AssertionError(f"{req.request_id} runs without a state slot")
            held = ledger.get(slot)
            if it.start and (held is None or held[0] is not req or held[1] != it.start):
                what = "none" if held is None else f"{held[0].request_id}'s after {held[1]}"
                raise AssertionError(
                    f"{req.request_id} resumes at token {it.start} from KV it holds, but its "
                    f"state slot {slot} holds {what} tokens' state: a sequence must never start "
                    "with cached KV and no matching state"
                )
            ledger[slot] = (req, it.start + it.num_tokens)  # once this step has run
            slots.append(slot)
            cached.append(it.start)
            new.append(it.num_tokens)
        meta = StateMetadata.build(slots, cached, new, self.device, saves)
        return StateBatch(meta, self.state)

    def run_state_copies(self, copies) -> None:
        """Check and run a step's state copies without its forward (every request of the
        step ended before it ran: its in-forward saves are not written, and not recorded)."""
        copies = _before(copies)
        self._state_copies(copies)
        if copies:
            self.state.run_copies(copies)

    def _state_copies(self, copies) -> None:
        """Check each state copy of the step against the ledger and record it: a save reads
        the request's own state after exactly ``tokens`` tokens; a restore reads a checkpoint
        of ``tokens`` tokens (``None`` in the ledger: a checkpoint, whoever saved it) and leaves
        the request's slot holding its state after them."""
        ledger = self._state_at
        for c in _before(copies):
            if c.host:  # a restore from the host tier's slot (not in this ledger: the cache's)
                ledger[c.dst] = (c.req, c.tokens)
                continue
            held = ledger.get(c.src)
            owner = c.req if c.save else None
            if held is None or held[0] is not owner or held[1] != c.tokens:
                what = "nothing" if held is None else f"{held[1]} tokens' state"
                raise AssertionError(
                    f"{c.req.request_id}: state copy {c.src} -> {c.dst} expects the state after "
                    f"{c.tokens} tokens, slot {c.src} holds {what}"
                )
            ledger[c.dst] = (None, c.tokens) if c.save else (c.req, c.tokens)

    def fork_state(self, src: Request, dst: Request) -> None:
        """``dst``, forked from ``src`` (``Scheduler.fork``: ``src``'s KV pages shared or
        copied), gets a copy of ``src``'s state in its own slot: never shared in place, since
        each sample writes its own from its next token on."""
        if self.state is None:
            return
        self.state.copy(src.state_slot, dst.state_slot)
        held = self._state_at.get(src.state_slot)
        self._state_at[dst.state_slot] = (dst, held[1] if held and held[0] is src else -1)

    def _window_kv(self, tables, cached, new) -> WindowKV | None:
        """The window layers' pool and block tables: each full page's window page, NULL where
        it was dropped (docs/window_cache.md). None without a window pool."""
        pool = self.pool
        if pool.window_k is None:
            return None
        wtables = [pool.allocator.window_table(t) for t in tables]
        meta, _ = AttentionMetadata.build(wtables, cached, new, pool.page_size, self.device)
        return WindowKV(meta, pool.window_k, pool.window_v, pool.layer_slots)


def _before(copies) -> list:
    """The state copies that run before a step's forward: all but its in-forward saves."""
    return [c for c in copies if not c.inside]


def resolve_device(device: str) -> torch.device:
    """The torch device for EngineConfig.device ("auto": CUDA when there is one)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return torch.device(device)
