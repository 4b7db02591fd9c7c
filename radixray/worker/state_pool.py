"""The state pool: every recurrent-state layer's state (hybrid models; model_meta/state_layers.py)
for a fixed number of slots, beside the KV pool (memory_pool.py). A running request owns one
slot; its state in every state layer lives at that slot index::

    short_conv:  [conv layers,  num_slots, hidden,   kernel - 1]        (LFM2)
    mamba_conv:  [mamba layers, num_slots, conv_dim, conv_kernel - 1]   (Mamba2's conv1d)
    mamba_ssm:   [mamba layers, num_slots, heads, head_dim, state_size] (Mamba2's SSM)

Layer-first like the KV pool: ``conv_state(i)`` / ``ssm_state(i)`` are the per-layer views the
model writes in place (worker/model/state_metadata.py). Slot ids are plain ints handed out by a
:class:`~radixray.cache_index.PageAllocator` (the same contract as pages: ``alloc`` returns None
when short, a double free raises); nothing here is read by the scheduler but those ints.

Host slots (``add_host``, a state cache with a host tier: docs/state_cache.md, "Host tier"):
the same tensors with ``host_slots`` slots in host memory (pinned on CUDA), where checkpoints
demoted with their nodes live. Slot ids of the two pools are separate ints (``host_allocator``).
Copies between them run on the device's stream in the order they are given: the cache's
demotions (``host_copies``, before a step's forward) and a step's restores from a host slot
(``run_copies``, a ``StateCopy`` with ``host`` set).

Dtypes: conv states hold past inputs exactly, so they are kept in the model's dtype; SSM states
accumulate over the whole sequence, so they are float32 by default (``ssm_dtype``), as vLLM's
and SGLang's Mamba caches keep them.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from radixray.cache_index import PageAllocator
from radixray.model_meta.model_config import ModelConfig

from .host_copies import cpu_zeros
from .memory_pool import DTYPES

__all__ = ["StatePool", "state_pool_for", "default_host_state_slots"]


class StatePool:
    """``num_slots`` slots of every state layer's state for ``config``'s model.

    State changes only through the model's forward (the slots of its step) and :meth:`copy`;
    ``alloc`` / ``free`` move slot ids only and never touch a tensor: a freshly allocated slot
    holds stale values, which the forward never reads for a sequence with no context before
    its step (state_metadata.py).
    """

    def __init__(
        self,
        config: ModelConfig,
        num_slots: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        ssm_dtype: torch.dtype = torch.float32,
    ) -> None:
        if not config.state_layers:
            raise ValueError(f"{config.architecture}: a model without state layers has no state")
        self.allocator = PageAllocator(num_slots)
        self.num_slots = num_slots
        self.host: dict[str, torch.Tensor] = {}  # host slots' tensors (``add_host``), or none
        self.host_allocator: PageAllocator | None = None
        self._where: dict[int, tuple[str, int]] = {}  # layer -> (kind, index among its kind)
        counts = {"conv": 0, "mamba": 0}
        for i in config.state_layers:
            kind = config.layer_kind(i)
            self._where[i] = (kind, counts[kind])
            counts[kind] += 1
        kw = {"device": torch.device(device)}
        self.tensors: dict[str, torch.Tensor] = {}
        if counts["conv"]:
            shape = config.short_conv.state_shape(config.hidden_size)
            self.tensors["short_conv"] = torch.zeros(
                counts["conv"], num_slots, *shape, dtype=dtype, **kw
            )
        if counts["mamba"]:
            m = config.mamba
            n = counts["mamba"]
            self.tensors["mamba_conv"] = torch.zeros(
                n, num_slots, *m.conv_state_shape(), dtype=dtype, **kw
            )
            self.tensors["mamba_ssm"] = torch.zeros(
                n, num_slots, *m.ssm_state_shape(), dtype=ssm_dtype, **kw
            )

    # --- slots (plain ints) -------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return self.allocator.num_free

    @property
    def num_used(self) -> int:
        return self.allocator.num_used

    @property
    def occupancy(self) -> float:
        """Share of slots in use, 0..1 (the load report's state-pool occupancy)."""
        return self.num_used / self.num_slots

    def alloc(self, n: int = 1) -> list[int] | None:
        """Take ``n`` slots, or None (taking nothing) when fewer are free: the caller waits or
        preempts, as for pages."""
        return self.allocator.alloc(n)

    def free(self, slots: Iterable[int]) -> None:
        """Return slots; an unknown, free or repeated id raises ValueError before any change."""
        self.allocator.free(slots)

    def check_integrity(self) -> None:
        self.allocator.check_integrity()

    # --- tensors ------------------------------------------------------------------------------

    def copy(self, src: int, dst: int) -> None:
        """Make slot ``dst`` hold a copy of slot ``src``'s state in every layer (a fork's own
        state, a checkpoint taken or restored): the two never share storage, so writing either
        later leaves the other as it was. Both must be allocated."""
        for slot in (src, dst):
            if not (isinstance(slot, int) and 0 <= slot < self.num_slots):
                raise ValueError(f"slot {slot!r} is out of range [0, {self.num_slots})")
            if self.allocator.is_free(slot):
                raise ValueError(f"slot {slot} is free: copy needs two allocated slots")
        if src == dst:
            return
        for t in self.tensors.values():
            t[:, dst].copy_(t[:, src])

    def run_copies(self, pairs) -> None:
        """The state copies of a step, (src, dst) slot pairs or ``StateCopy``s in order, as its
        forward runs (the scheduler checked the slots when it planned them; some may be free
        by now, their copy harmless: nothing reads a free slot). A ``StateCopy`` with ``host``
        set reads host slot ``src`` (a checkpoint on the host tier)."""
        for c in pairs:
            src, dst = c[0], c[1]
            host = getattr(c, "host", False)
            for name, t in self.tensors.items():
                if host:
                    _copy_slot(t, dst, self.host[name], src)
                else:
                    t[:, dst].copy_(t[:, src])

    # --- the host tier's slots ----------------------------------------------------------------

    def add_host(self, host_slots: int) -> PageAllocator:
        """Give the pool ``host_slots`` host slots (every state layer's state, in host memory:
        pinned on CUDA so the copies are DMA); returns their allocator (for the cache)."""
        if host_slots < 1:
            raise ValueError(f"host_slots must be >= 1, got {host_slots!r}")
        cuda = next(iter(self.tensors.values())).device.type == "cuda"
        self.host = {}
        for name, t in self.tensors.items():
            shape = (t.shape[0], host_slots, *t.shape[2:])
            self.host[name] = (
                torch.zeros(shape, dtype=t.dtype, pin_memory=True)
                if cuda
                else cpu_zeros(shape, t.dtype)
            )
        self.host_allocator = PageAllocator(host_slots)
        return self.host_allocator

    def host_slots_for(self, host_pages: int, num_pages: int) -> int:
        """Host slots beside ``host_pages`` host pages behind ``num_pages`` device pages
        (``default_host_state_slots``, capped on CUDA by ``_host_state_budget``)."""
        device = next(iter(self.tensors.values())).device
        budget = _host_state_budget(device)
        return default_host_state_slots(
            host_pages, num_pages, self.num_slots, budget, self.bytes_per_slot
        )

    def host_copies(self, copies) -> int:
        """Run the cache's state copies (``PageCopy(state=True)``: device slots -> host slots,
        or back), in order, now, on the current stream; the bytes moved."""
        n = 0
        for c in copies:
            for name, t in self.tensors.items():
                h = self.host[name]
                for a, b in zip(c.src, c.dst, strict=True):
                    if c.to_host:
                        _copy_slot(h, b, t, a)
                    else:
                        _copy_slot(t, b, h, a)
            n += len(c.src)
        return n * self.bytes_per_slot

    def conv_state(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s conv state of every slot, ``[num_slots, channels, kernel - 1]``."""
        kind, j = self._layer(layer)
        return self.tensors["short_conv" if kind == "conv" else "mamba_conv"][j]

    def ssm_state(self, layer: int) -> torch.Tensor:
        """Mamba layer ``layer``'s SSM state of every slot, ``[num_slots, H, P, N]``."""
        kind, j = self._layer(layer)
        if kind != "mamba":
            raise ValueError(f"layer {layer} is a {kind} layer: it has no SSM state")
        return self.tensors["mamba_ssm"][j]

    def _layer(self, layer: int) -> tuple[str, int]:
        if layer not in self._where:
            raise ValueError(f"layer {layer} has no state (state layers: {sorted(self._where)})")
        return self._where[layer]

    @property
    def bytes_per_slot(self) -> int:
        """Memory of one slot across every state layer (to size the pool beside the KV pool)."""
        return sum(t[:, 0].numel() * t.element_size() for t in self.tensors.values())

    def __repr__(self) -> str:
        return (
            f"StatePool(num_slots={self.num_slots}, num_free={self.num_free}, "
            f"bytes_per_slot={self.bytes_per_slot})"
        )


def default_host_state_slots(
    host_pages: int, num_pages: int, state_slots: int, budget: int | None = None, slot: int = 1
) -> int:
    """Host state slots beside ``host_pages`` host pages (a state cache's host tier, docs/
    state_cache.md): the device pools' ratio of state slots to KV pages, so the host tier can
    keep checkpoints as densely as the device can; within ``budget`` bytes at ``slot`` bytes a
    slot if given (on CUDA a quarter of the host memory available: the host KV takes up to
    half, ``default_host_pages``); at least 2."""
    n = -(-host_pages * state_slots // max(1, num_pages))
    if budget is not None:
        n = min(n, budget // max(1, slot))
    return max(2, n)


def _host_state_budget(device: torch.device) -> int | None:
    """Host bytes the host state slots may take: on CUDA a quarter of what is available now
    (pinned memory is not swappable); on the CPU no cap (host_pages was set explicitly)."""
    if device.type != "cuda":
        return None
    try:
        import psutil
    except ImportError:
        return None
    return psutil.virtual_memory().available // 4


def _copy_slot(dst: torch.Tensor, d: int, src: torch.Tensor, s: int) -> None:
    """Slot ``s`` of ``src`` into slot ``d`` of ``dst``, layer by layer (each a contiguous
    block: a plain DMA between device and pinned host memory, asynchronous to the host thread
    and in order on the current stream)."""
    for layer in range(dst.shape[0]):
        dst[layer, d].copy_(src[layer, s], non_blocking=True)


def state_pool_for(mcfg: ModelConfig, config, device: torch.device) -> StatePool | None:
    """The engine's state pool for a model under an ``EngineConfig``: ``state_slots`` slots
    (None: a slot per request that can run at once, ``max_running``, and with a state cache as
    many again for its checkpoints), conv states in the model's dtype; None for a model without
    state layers."""
    if not mcfg.state_layers:
        return None
    keeps = 2 if config.cache != "chunk" else 1  # a state cache keeps checkpoints
    slots = config.state_slots or keeps * config.max_running
    return StatePool(mcfg, slots, device, DTYPES[config.dtype])
