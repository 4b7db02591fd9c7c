"""Hybrid models in the simulator (docs/state_cache.md, "In the simulator").

A hybrid keeps KV only in its attention layers; its other layers (Mamba2, Gated DeltaNet) keep
a fixed-size recurrent state, so a prefix is reusable only up to a point where that state was
saved: a *checkpoint*, a slot of the state pool. The engine runs ``mamba_radix``
(``MambaRadixCache``: KV pages + checkpoints) and takes checkpoints where its
``StateCheckpointer`` says (page ends that are multiples of ``state_interval``, and the
prompt's last full page; saved inside a prefill chunk's forward, or copied where a step
starts); ``HybridSimWorker`` is a simulated worker over exactly those, the engine's own
scheduler holding a state slot per running request, so checkpoint saves, restores, the
checkpoint LRU and the KV events of the ``mamba`` group happen as they would live.

``HybridLayout`` is a model's memory: the attention layers' KV bytes a token and one slot's
state bytes (every state layer's conv state in the model's dtype, its SSM state in float32, as
the engine's ``StatePool`` keeps them, and as vLLM and SGLang keep the SSM state by default).
``hybrid_pools`` sizes a worker's two pools from ONE memory budget: the state slots asked for
(running requests' slots and checkpoints share them), the KV pages from the rest.

- Granite-4.0-H-Small (``GRANITE_4_H_SMALL``, from its ``config.json``: 40 layers, 4 attention
  (8 KV heads of 128) and 36 Mamba2 (128 heads of 64, state 128, 1 group, conv kernel 4, so a
  conv of 8,192 + 2 x 128 = 8,448 channels); bfloat16): 4 x 2 x 8 x 128 x 2 = 16 KiB of KV a
  token; a slot 36 x (8,448 x 3 x 2 + 128 x 64 x 128 x 4) bytes = 145.7 MiB, the KV of 9,327
  tokens.
- Qwen3-Next-80B-A3B (``QWEN3_NEXT_80B``, simulator only: its Gated DeltaNet layers' state has
  the same role; 48 layers, every 4th full attention (2 KV heads of 256), 36 linear-attention
  layers with 16 key heads and 32 value heads of 128, conv kernel 4; bfloat16): 24 KiB of KV a
  token; a slot 36 x (8,192 x 3 x 2 + 32 x 128 x 128 x 4) bytes = 73.7 MiB, 3,145 tokens of KV.

``hybrid_timing`` derives a timing model from the ``gpu`` preset (an 8B Llama on one
H100-class GPU: 8.0B parameters, 7.0B without the embeddings, 32 layers of 32 query heads of
128, 128 KiB of KV a token; itself illustrative, not measured here) by these ratios:

- ``step_overhead_s`` (reading the weights each step) x ``weights_ratio``: the weights a step
  reads against Llama's, every expert counted (a batch of tens of sequences touches nearly
  all): Granite 32.2B in bfloat16 (x 4.0); Qwen3-Next 80B in FP8 to fit one 141 GB GPU (x 5.0);
- ``prefill_token_s`` and ``decode_seq_s`` (compute a token) x ``active_ratio``: active
  non-embedding parameters against Llama's 7.0B: Granite ~8.6B (x 1.23), Qwen3-Next ~2.4B
  (x 0.34); the state layers' scan is linear in tokens, so it is inside this term;
- ``prefill_attn_s`` (attention over the context) by the attention layers' query width against
  Llama's: Granite 4 x 32 x 128 (x 0.125), Qwen3-Next 12 x 16 x 256 (x 0.375);
- ``decode_ctx_s`` (a context token's KV read each decode step) by the KV bytes a token
  (x 0.125, x 0.1875); each decoding sequence also reads and writes its state each step, at the
  bytes per second that term implies (131,072 B / 20 ns): + 2 x slot bytes of it to
  ``decode_seq_s`` (Granite + 47 us, Qwen3-Next + 24 us);
- ``max_running`` 64 (the gpu preset's 256 would hold 36 GiB of Granite states); each state
  copy (a checkpoint saved or restored) reads and writes a slot at that rate too
  (``state_copy_seconds``), run before the step's forward, in series (``overlap_layers`` 0); a
  save the forward writes inside a prefill chunk costs half (the write).
"""

from __future__ import annotations

from dataclasses import dataclass

from radixray.cache_index import ChunkCache, PageAllocator
from radixray.cache_index.mamba_radix_cache import MambaRadixCache
from radixray.worker.scheduler_config import SchedulerConfig

from .sim_worker import SimWorker
from .timing import TIMING_PRESETS, TimingModel
from .window import SWASimWorker

__all__ = [
    "GRANITE_4_H_SMALL",
    "HYBRID_CACHES",
    "LAYOUTS",
    "QWEN3_NEXT_80B",
    "REQUEST_ENDS",
    "check_config",
    "HybridLayout",
    "HybridPools",
    "HybridSimWorker",
    "hybrid_pools",
    "hybrid_timing",
    "index_states",
    "state_copy_seconds",
    "worker_kind",
]

# A state_interval no prompt reaches: checkpoints only at each prompt's last full page (what a
# chat's next turn resumes from), the engine's rule with the interval points taken away.
REQUEST_ENDS = 1 << 40
# "mamba_radix": the engine's state cache; "chunk": no reuse (a slot per running request only)
HYBRID_CACHES = ("mamba_radix", "chunk")

# The gpu preset's model (timing.py): Llama-3.1-8B
_LLAMA_ATTN = 32 * 32 * 128  # layers x query heads x head_dim
_LLAMA_KV = 2 * 32 * 8 * 128 * 2  # bytes of KV a token (bfloat16)


@dataclass(frozen=True)
class HybridLayout:
    """A hybrid model's memory and the ratios its timing is scaled by (``hybrid_timing``)."""

    name: str
    attention_layers: int
    kv_heads: int
    head_dim: int
    query_heads: int
    state_layers: int
    conv_dim: int  # channels of a state layer's short convolution
    conv_kernel: int
    ssm_shape: tuple[int, int, int]  # one state layer's SSM (recurrent) state
    weights_ratio: float  # weights read per step against the gpu preset's model
    active_ratio: float  # active non-embedding parameters against its 7.0B
    dtype_bytes: int = 2  # KV and conv state (bfloat16)
    ssm_dtype_bytes: int = 4  # SSM state (float32, as StatePool keeps it)

    def __post_init__(self):
        for name in ("attention_layers", "kv_heads", "head_dim", "query_heads", "state_layers",
                     "conv_dim", "conv_kernel", "dtype_bytes", "ssm_dtype_bytes"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"HybridLayout.{name} must be >= 1, got {getattr(self, name)}")
        if self.weights_ratio <= 0 or self.active_ratio <= 0:
            raise ValueError("HybridLayout.weights_ratio and active_ratio must be > 0")

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every attention layer for one token."""
        return self.attention_layers * 2 * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def state_bytes(self) -> int:
        """One state slot: every state layer's conv state (the last ``conv_kernel - 1``
        inputs) and SSM state."""
        a, b, c = self.ssm_shape
        conv = self.conv_dim * (self.conv_kernel - 1) * self.dtype_bytes
        return self.state_layers * (conv + a * b * c * self.ssm_dtype_bytes)


GRANITE_4_H_SMALL = HybridLayout(
    "Granite-4.0-H-Small", 4, 8, 128, 32, 36, 8192 + 2 * 128, 4, (128, 64, 128), 4.0, 1.23
)
QWEN3_NEXT_80B = HybridLayout(
    "Qwen3-Next-80B-A3B", 12, 2, 256, 16, 36, 2 * 16 * 128 + 32 * 128, 4, (32, 128, 128), 5.0, 0.34
)
LAYOUTS = {"granite-4.0-h": GRANITE_4_H_SMALL, "qwen3-next": QWEN3_NEXT_80B}


def hybrid_timing(layout: HybridLayout, base: TimingModel | None = None) -> TimingModel:
    """The ``gpu`` preset scaled to ``layout`` (the module's docstring derives each field)."""
    b = base or TIMING_PRESETS["gpu"]
    kv = layout.kv_bytes_per_token
    attn = layout.attention_layers * layout.query_heads * layout.head_dim / _LLAMA_ATTN
    state_rw = 2 * layout.state_bytes / _LLAMA_KV * b.decode_ctx_s
    return b.with_(
        step_overhead_s=b.step_overhead_s * layout.weights_ratio,
        decode_seq_s=b.decode_seq_s * layout.active_ratio + state_rw,
        prefill_token_s=b.prefill_token_s * layout.active_ratio,
        prefill_attn_s=b.prefill_attn_s * attn,
        decode_ctx_s=b.decode_ctx_s * kv / _LLAMA_KV,
        max_running=min(b.max_running, 64),
        kv_bytes_per_token=kv,
        overlap_layers=0,
    )


def state_copy_seconds(layout: HybridLayout, timing: TimingModel) -> float:
    """One slot-to-slot state copy (read and write a slot) at the rate ``timing``'s
    ``decode_ctx_s`` implies for its ``kv_bytes_per_token``."""
    if timing.kv_bytes_per_token <= 0:
        return 0.0
    return 2 * layout.state_bytes * timing.decode_ctx_s / timing.kv_bytes_per_token


def hybrid_pools(
    layout: HybridLayout, budget_bytes: int, page_size: int, state_slots: int
) -> tuple[int, int]:
    """(KV pages, state slots) that ``budget_bytes`` buys with ``state_slots`` slots of state
    (running requests' and checkpoints together): the KV pool gets the rest. Refuses a budget
    whose rest is not one page."""
    if state_slots < 1:
        raise ValueError(
            f"state_slots must be >= 1 (a slot per running request), got {state_slots}"
        )
    rest = budget_bytes - state_slots * layout.state_bytes
    pages = rest // (page_size * layout.kv_bytes_per_token)
    if pages < 1:
        raise ValueError(
            f"{state_slots} state slots of {layout.state_bytes} bytes leave {rest} bytes of a "
            f"{budget_bytes}-byte budget: not one {page_size}-token KV page"
        )
    return pages, state_slots


@dataclass(frozen=True)
class HybridPools:
    """A hybrid model in every simulated worker (``SimConfig.hybrid``): ``state_slots`` slots
    per worker beside its ``num_pages`` KV pages, checkpoints every ``state_interval`` tokens
    (``REQUEST_ENDS``: only at prompts' last full pages), ``cache`` "mamba_radix" or "chunk"
    (no reuse), each state copy priced ``state_copy_s``; ``index_states`` False makes the
    router's index checkpoint-blind (KV blocks only, as Dynamo's today)."""

    state_slots: int
    state_interval: int = SchedulerConfig.state_interval
    cache: str = "mamba_radix"
    state_copy_s: float = 0.0
    index_states: bool = True

    def __post_init__(self):
        if not isinstance(self.state_slots, int) or self.state_slots < 1:
            raise ValueError(
                f"HybridPools.state_slots must be an int >= 1, got {self.state_slots!r}"
            )
        if not isinstance(self.state_interval, int) or self.state_interval < 1:
            raise ValueError(
                f"HybridPools.state_interval must be an int >= 1, got {self.state_interval!r}"
            )
        if self.cache not in HYBRID_CACHES:
            raise ValueError(
                f"HybridPools.cache must be one of {HYBRID_CACHES}, got {self.cache!r}"
            )
        if self.state_copy_s < 0:
            raise ValueError(f"HybridPools.state_copy_s must be >= 0, got {self.state_copy_s}")


class HybridSimWorker(SimWorker):
    """A simulated worker whose engine serves a hybrid: ``state_slots`` state slots (a
    ``PageAllocator`` of ints, as the engine's ``StatePool`` hands them out) beside the KV
    pages, one held by each running request; with ``cache="mamba_radix"`` the engine's
    ``MambaRadixCache`` keeps checkpoints in the rest, taken every ``state_interval`` tokens and
    at each prompt's last full page, its KV events naming them in the ``mamba`` group. Each step
    is charged its state copies (``state_copy_s`` each) before its forward."""

    def __init__(
        self,
        *args,
        state_slots: int,
        state_interval: int = SchedulerConfig.state_interval,
        cache: str = "mamba_radix",
        state_copy_s: float = 0.0,
        **kwargs,
    ):
        pools = HybridPools(state_slots, state_interval, cache, state_copy_s)  # checks them
        self._pools = pools
        self.state_interval = pools.state_interval  # read by SimWorker's SchedulerConfig
        self.state_copies = 0  # checkpoints saved and restored
        self.state_copy_seconds = 0.0
        super().__init__(*args, **kwargs)

    def _make_cache(self, num_pages, eviction, enable_events, host_pages, write_through):
        if host_pages:
            raise ValueError("a hybrid's host tier is not modelled in the simulator")
        self.allocator = PageAllocator(num_pages)
        self.host_allocator = None
        self.state_slots = PageAllocator(self._pools.state_slots)
        if self._pools.cache == "chunk":
            return ChunkCache(self.P, self.allocator)
        return MambaRadixCache(
            self.P, self.allocator, self.state_slots, eviction, enable_events=enable_events
        )

    def _copy_time(self) -> float:
        """The step's state copies (no host tier here), in series before its forward: a slot
        read and written each; a save the forward writes inside a chunk costs the write only."""
        copies = self._batch.state_copies
        inside = sum(1 for c in copies if c.inside)
        t = (len(copies) - inside / 2) * self._pools.state_copy_s
        self.state_copies += len(copies)
        self.state_copy_seconds += t
        return t

    @property
    def checkpoints(self) -> int:
        """Checkpoints the cache holds now (0 for a chunk cache)."""
        cache = self.cache
        return cache.num_states if isinstance(cache, MambaRadixCache) else 0


def worker_kind(cfg) -> tuple[type[SimWorker], dict]:
    """The simulated worker class a ``SimConfig`` asks for and its extra arguments: a window
    pool, a hybrid's pools, or the plain radix cache."""
    if cfg.window:
        return SWASimWorker, {"window": cfg.window, "window_pages": cfg.window_pages}
    h = cfg.hybrid
    if h is None:
        return SimWorker, {}
    return HybridSimWorker, {
        "state_slots": h.state_slots,
        "state_interval": h.state_interval,
        "cache": h.cache,
        "state_copy_s": h.state_copy_s,
    }


def index_states(cfg) -> bool:
    """Whether the router's index cuts matches at checkpoints (``ApproxIndex(states=...)``)."""
    return cfg.hybrid is None or cfg.hybrid.index_states


def check_config(cfg) -> None:
    """A ``SimConfig``'s hybrid is neither windowed (a model with both kinds of layers is
    not simulated) nor tiered (the engine's state host tier is not modelled here: its copies
    of state slots would need pricing)."""
    if cfg.hybrid is not None and (cfg.window or cfg.host_pages):
        raise ValueError("a hybrid (SimConfig.hybrid) has no window pool and no host tier here")
