"""Sliding-window models in the simulator (docs/window_cache.md, "In the simulator").

A model with sliding-window layers keeps two kinds of KV: its full-attention layers' for every
position, its window layers' only for the last ``window`` positions a query reads. The engine
gives the window layers a pool of their own and runs ``swa_radix`` (``SWARadixCache`` over a
``WindowedAllocator``); ``SWASimWorker`` is a simulated worker over exactly those, so the
engine's window trimming, window eviction and reusable-prefix cut happen as they would live.

``WindowModel`` is a model's layout (layers of each kind, the window, KV bytes per token per
group); ``pool_pages`` sizes a worker's pools from a memory budget as the engine sizes them
(``KVPool._windowed``: ``WINDOW_SHARE`` window pages per full page, at least two requests'
window, at most one per full page), and ``plain_pages`` sizes one pool that keeps every layer's
pages (a cache that does not know windows), so the two compare at the same memory.

Gemma-3-12B (``GEMMA3_12B``, from its ``config.json``: 48 layers, every 6th global, the other 40
with a 1,024-token window; 8 KV heads of 256; bfloat16): 8 x 8 KiB = 64 KiB of full-attention KV
a token, 40 x 8 KiB = 320 KiB of window KV a token, 384 KiB a token in a plain pool.

``gemma3_12b_timing`` derives a timing model from the ``gpu`` preset (an 8B Llama on one
H100-class GPU; illustrative, not measured here) by the ratios of the two models' sizes:

- ``step_overhead_s`` (reading the weights each step) and ``decode_seq_s`` (per-sequence
  compute) x 1.5, the ratio of the parameters (11.8B against 8.0B);
- ``prefill_token_s`` x 1.5, the ratio of the non-embedding parameters (10.8B against 7.0B,
  rounded to the same 1.5), plus the window layers' attention at its cap (a window of keys per
  token: 40 layers x 16 query heads x 256 against Llama's 32 x 32 x 128 per context token, times
  1,024 keys: 0.26 us a token, 0.2% of it);
- ``prefill_attn_s`` (attention over the whole context) x 0.25: only the 8 global layers read
  it (8 x 16 x 256 against 32 x 32 x 128);
- ``decode_ctx_s`` (reading a context token's KV each decode step) x 0.5, the global layers'
  64 KiB against Llama's 128 KiB; each decoding sequence also reads its window layers' last
  1,024 positions (320 KiB each, at the same bytes per second): + 51 us to ``decode_seq_s``;
- batch limits, copy bandwidth as the preset; ``kv_bytes_per_token`` the plain pool's 384 KiB.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixray.cache_index.swa_radix_cache import SWARadixCache
from radixray.cache_index.window_pages import WindowedAllocator, window_pages_needed

from .sim_worker import SimWorker
from .timing import TIMING_PRESETS, TimingModel

__all__ = [
    "GEMMA3_12B",
    "WINDOW_SHARE",
    "SWASimWorker",
    "WindowModel",
    "gemma3_12b_timing",
    "plain_pages",
    "pool_pages",
]

# The engine's window pages per full page in a pool sized from a budget (worker/memory_pool.py's
# WINDOW_SHARE; a test holds the two equal: that module imports torch, this one must not).
WINDOW_SHARE = 0.25


@dataclass(frozen=True)
class WindowModel:
    name: str
    num_layers: int
    window_layers: int
    window: int  # tokens
    layer_kv_bytes: int  # K and V of one layer for one token

    def __post_init__(self):
        if not 0 < self.window_layers < self.num_layers:
            raise ValueError("a window model has window layers and full-attention layers")
        if self.window < 1 or self.layer_kv_bytes < 1:
            raise ValueError("window and layer_kv_bytes must be >= 1")

    @property
    def full_bytes_per_token(self) -> int:
        return (self.num_layers - self.window_layers) * self.layer_kv_bytes

    @property
    def window_bytes_per_token(self) -> int:
        return self.window_layers * self.layer_kv_bytes

    @property
    def plain_bytes_per_token(self) -> int:
        """Every layer's KV: a pool that keeps every page of every layer."""
        return self.num_layers * self.layer_kv_bytes


# Gemma-3-12B: 48 layers, 8 KV heads x head_dim 256, bfloat16 (2 x 8 x 256 x 2 bytes a layer),
# sliding_window 1024, every 6th layer global (sliding_window_pattern 6).
GEMMA3_12B = WindowModel("Gemma-3-12B", 48, 40, 1024, 2 * 8 * 256 * 2)


def plain_pages(model: WindowModel, budget_bytes: int, page_size: int) -> int:
    return max(1, budget_bytes // (page_size * model.plain_bytes_per_token))


def pool_pages(
    model: WindowModel,
    budget_bytes: int,
    page_size: int,
    max_batch_tokens: int,
    share: float = WINDOW_SHARE,
) -> tuple[int, int]:
    """(full pages, window pages) that ``budget_bytes`` buys, as the engine sizes them."""
    per_token = max(1, int(model.full_bytes_per_token + share * model.window_bytes_per_token))
    full = max(2, budget_bytes // (page_size * per_token))
    one = window_pages_needed(model.window, page_size, max_batch_tokens)
    window = max(min(full, max(int(share * full), 2 * one)), one)
    return full, window


def gemma3_12b_timing(base: TimingModel | None = None) -> TimingModel:
    """The ``gpu`` preset scaled to Gemma-3-12B (the module's docstring derives each field)."""
    b = base or TIMING_PRESETS["gpu"]
    m = GEMMA3_12B
    llama_attn = 32 * 32 * 128  # Llama-3.1-8B: layers x query heads x head_dim
    window_attn = m.window_layers * 16 * 256 / llama_attn
    full_attn = (m.num_layers - m.window_layers) * 16 * 256 / llama_attn
    llama_kv = 2 * 32 * 8 * 128 * 2  # bytes a token
    return b.with_(
        step_overhead_s=b.step_overhead_s * 1.5,
        decode_seq_s=b.decode_seq_s * 1.5
        + b.decode_ctx_s * m.window * m.window_bytes_per_token / llama_kv,
        prefill_token_s=b.prefill_token_s * 1.5 + b.prefill_attn_s * window_attn * m.window,
        prefill_attn_s=b.prefill_attn_s * full_attn,
        decode_ctx_s=b.decode_ctx_s * m.full_bytes_per_token / llama_kv,
        kv_bytes_per_token=m.plain_bytes_per_token,
    )


class SWASimWorker(SimWorker):
    """A simulated worker whose engine runs ``swa_radix``: full pages and window pages in two
    pools (``window_pages`` of them, the NULL page not counted), the scheduler trimming each
    request's window after every step and evicting window pages first, as the engine does."""

    def __init__(self, *args, window: int, window_pages: int, **kwargs):
        self._window, self._window_pages = window, window_pages
        super().__init__(*args, **kwargs)

    def _make_cache(self, num_pages, eviction, enable_events, host_pages, write_through):
        if host_pages:
            raise ValueError("a simulated window pool has no host tier (not modelled)")
        self.allocator = WindowedAllocator(num_pages, self._window_pages + 1, self._window)
        self.host_allocator = None
        return SWARadixCache(self.P, self.allocator, eviction, enable_events=enable_events)
