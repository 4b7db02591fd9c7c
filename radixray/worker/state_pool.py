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

Dtypes: conv states hold past inputs exactly, so they are kept in the model's dtype; SSM states
accumulate over the whole sequence, so they are float32 by default (``ssm_dtype``), as vLLM's
and SGLang's Mamba caches keep them.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from radixray.cache_index import PageAllocator
from radixray.model_meta.model_config import ModelConfig

from .memory_pool import DTYPES

__all__ = ["StatePool", "state_pool_for"]


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
        """The state copies of a step, (src, dst) slot pairs in order, as its forward runs
        (the scheduler checked the slots when it planned them; some may be free by now, their
        copy harmless: nothing reads a free slot)."""
        for src, dst in pairs:
            for t in self.tensors.values():
                t[:, dst].copy_(t[:, src])

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
