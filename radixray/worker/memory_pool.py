"""The KV memory pool: one K and one V tensor for all layers, plus the page allocator; and the
host tier's K and V (docs/host_tier.md) with the copies between them. "All layers" are the
attention layers: a hybrid's recurrent-state layers keep no KV (their state is the state pool's,
state_pool.py), so its pool's layer ``j`` is model layer ``ModelConfig.attention_layers[j]``.

    k_cache, v_cache: [num_layers, num_pages, page_size, num_kv_heads, head_dim]
    host.k, host.v:   [num_layers, host_pages, page_size, num_kv_heads, head_dim]
    window_k, window_v: [window layers, window_pages, page_size, num_kv_heads, head_dim]

With ``window_layers`` (a model's sliding-window layers, docs/window_cache.md) those layers keep
their KV in a pool of their own (``window_k``/``window_v``, paged by the allocator's window
pages: ``cache_index.window_pages``) and ``k_cache``/``v_cache`` hold the other layers only;
``layer_slots[i]`` says where layer ``i`` lives.
With a host tier too, ``host_window`` keeps the window layers' host pages (the host
allocator is then a ``WindowedAllocator``, docs/window_cache.md).

``k_cache[l]`` is the per-layer view the kernels take ([num_pages, P, Hkv, D], the layout of
vLLM's flash-attn fork). Page ids index dimension 1 and are handed out by ``PageAllocator``. The
host tier (``host_copies.py``) is layer-first too, and its copies run layer by layer: on CUDA
on their own stream, each layer's awaited by the forward just before that layer; on the CPU
each layer's right before that layer.
"""

from __future__ import annotations

import torch

from radixray.cache_index import PageAllocator, PrefixCache, make_cache
from radixray.cache_index.window_pages import WindowedAllocator, window_pages_needed

from .host_copies import Copied, HostCopies, HostKV, cpu_zeros

__all__ = [
    "KVPool",
    "kv_bytes_per_token",
    "pages_for_budget",
    "default_kv_budget",
    "default_host_pages",
    "DTYPES",
    "cache_kind",
]

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Without a configured budget a CPU pool takes at most this much, and at most a quarter of the
# available memory: the same machine runs the model, Ray and often another worker.
_CPU_DEFAULT_BUDGET = 2 << 30
# On a GPU the pool takes this share of the memory left free after the weights are loaded.
_GPU_MEMORY_SHARE = 0.85
# A window pool sized from a budget gets this many window pages per full page: full pages keep
# whole prefixes for reuse; a window page is needed only for a running request's window and
# the last window before each cached prefix's end.
WINDOW_SHARE = 0.25


def cache_kind(cache: str, mcfg) -> str:
    """The cache an engine builds for ``cache`` (EngineConfig's) and a model: "radix" on a
    model with sliding-window layers is "swa_radix" (docs/window_cache.md), on a model with
    recurrent-state layers "mamba_radix": cached KV pages alone cannot resume a sequence,
    which needs the state after exactly its cached tokens too, so that cache keeps state
    checkpoints beside them (docs/models.md, "Serving a hybrid")."""
    if mcfg.state_layers:
        if cache not in ("radix", "mamba_radix", "chunk"):
            raise ValueError(
                f"cache={cache!r}: {mcfg.architecture} has recurrent-state layers "
                f"{list(mcfg.state_layers)} (cache 'radix', 'mamba_radix' or 'chunk')"
            )
        return "chunk" if cache == "chunk" else "mamba_radix"
    if cache == "mamba_radix":
        raise ValueError(
            "cache='mamba_radix' needs a model with recurrent-state layers; this one has none "
            "(use cache='radix')"
        )
    windowed = any(mcfg.window(i) is not None for i in range(mcfg.num_layers))
    if cache == "radix" and windowed:
        return "swa_radix"
    if cache == "swa_radix" and not windowed:
        raise ValueError(
            "cache='swa_radix' needs a model with sliding-window layers; this one has none "
            "(use cache='radix')"
        )
    return cache


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype) -> int:
    return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def pages_for_budget(budget_bytes: int, page_size: int, bytes_per_token: int) -> int:
    return max(1, budget_bytes // (page_size * bytes_per_token))


def default_kv_budget(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * _GPU_MEMORY_SHARE)
    try:
        import psutil

        available = psutil.virtual_memory().available
    except ImportError:  # psutil comes with ray; stay usable without it
        available = 4 * _CPU_DEFAULT_BUDGET
    return min(_CPU_DEFAULT_BUDGET, available // 4)


def default_host_pages(device: torch.device, device_pages: int, bytes_per_page: int) -> int:
    """``host_pages=None``: on CUDA twice the device pages (SGLang's HiCache default ratio), at
    most half the host memory available now; on the CPU none (the "host" is the same memory)."""
    if device.type != "cuda":
        return 0
    try:
        import psutil

        available = psutil.virtual_memory().available
    except ImportError:
        return 0
    return max(0, min(2 * device_pages, available // 2 // max(1, bytes_per_page)))


def _host_pages(config, mcfg, device: torch.device, num_pages: int, reuse: bool) -> int:
    """``EngineConfig.host_pages`` for a pool of ``num_pages`` device pages: 0 without prefix
    reuse (nothing to keep), the device's default (``default_host_pages``) for None."""
    if not reuse:
        return 0
    if config.host_pages is not None:
        return config.host_pages
    dtype = DTYPES[config.dtype]
    per_token = kv_bytes_per_token(
        len(mcfg.attention_layers), mcfg.num_kv_heads, mcfg.head_dim, dtype
    )
    return default_host_pages(device, num_pages, config.page_size * per_token)


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
    """A zeroed tensor. On the CPU from an anonymous memory map, which the kernel hands out as
    zero pages on first touch: ``torch.zeros`` writes every byte up front, and a default 2 GB CPU
    pool per worker took seconds of a worker's start (more with two workers on 2 cores) for
    pages most runs never use."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    return cpu_zeros(shape, dtype)


class KVPool:
    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        host_pages: int = 0,
        *,
        window_layers: tuple[int, ...] = (),
        window_pages: int = 0,
        window: int = 0,
        host_window_pages: int = 0,
    ):
        self.window_layers = tuple(sorted(window_layers))
        full = [i for i in range(num_layers) if i not in self.window_layers]
        # layer -> (in the window pool, its index in that pool's tensors)
        self.layer_slots = [
            (True, self.window_layers.index(i))
            if i in self.window_layers
            else (False, full.index(i))
            for i in range(num_layers)
        ]
        shape = (len(full), num_pages, page_size, num_kv_heads, head_dim)
        self.k_cache = _zeros(shape, dtype, device)
        self.v_cache = _zeros(shape, dtype, device)
        self.window_k = self.window_v = None
        self.host_window = None
        if self.window_layers:
            wshape = (len(self.window_layers), window_pages, page_size, num_kv_heads, head_dim)
            self.window_k = _zeros(wshape, dtype, device)
            self.window_v = _zeros(wshape, dtype, device)
            self.allocator = WindowedAllocator(num_pages, window_pages, window)
        else:
            self.allocator = PageAllocator(num_pages)
        self.page_size = page_size
        self.num_pages = num_pages
        self.host_pages = host_pages
        self.host = HostKV(self.k_cache, self.v_cache, host_pages) if host_pages else None
        self.host_allocator = PageAllocator(host_pages) if host_pages else None
        if host_pages and self.window_layers:  # host pages with host window pages (swa_host)
            hw = max(2, host_window_pages)
            self.host_window = HostKV(self.window_k, self.window_v, hw)
            self.host_allocator = WindowedAllocator(host_pages, hw, window)
        # the window pool's copies follow the same per-layer rule (each window layer's slot)
        self.copier = (
            HostCopies(self.layer_slots, self.host, self.host_window) if self.host else None
        )
        self.state_pool = None  # a state cache's host tier: the StatePool its copies go to
        self.kv_index: dict[int, int] | None = None  # a hybrid's model layer -> pool layer

    @classmethod
    def for_model(
        cls, mcfg, config, device: torch.device, max_model_len: int, cache: str | None = None
    ) -> KVPool:
        """Size a pool for a ModelConfig under an EngineConfig: ``num_pages`` if set, else the
        memory budget, capped at what ``max_running`` sequences of ``max_model_len`` could ever
        use (a tiny test model must not allocate gigabytes). ``cache`` (the resolved kind,
        default ``config.cache``) "swa_radix", or "chunk" on a model with window layers, gives
        the window layers a pool of their own (``_windowed``)."""
        cache = cache or config.cache
        windows = [i for i in range(mcfg.num_layers) if mcfg.window(i) is not None]
        if windows and cache in ("swa_radix", "chunk"):
            return cls._windowed(mcfg, config, device, max_model_len, windows, cache)
        dtype = DTYPES[config.dtype]
        P = config.page_size
        layers = len(mcfg.attention_layers)  # a hybrid's state layers keep no KV (state_pool.py)
        if config.num_pages is not None:
            num_pages = config.num_pages
        else:
            per_token = kv_bytes_per_token(layers, mcfg.num_kv_heads, mcfg.head_dim, dtype)
            budget = config.kv_memory_bytes or default_kv_budget(device)
            cap = -(-config.max_running * max_model_len // P)
            num_pages = max(2, min(pages_for_budget(budget, P, per_token), cap))
        reuse = cache in ("radix", "mamba_radix")  # mamba_radix: checkpoints go to the host too
        host_pages = _host_pages(config, mcfg, device, num_pages, reuse=reuse)
        shape = (layers, num_pages, P, mcfg.num_kv_heads, mcfg.head_dim)
        pool = cls(*shape, dtype, device, host_pages)
        if mcfg.state_layers:  # the forward names model layers; the pool's are the KV ones
            pool.kv_index = {layer: j for j, layer in enumerate(mcfg.attention_layers)}
        return pool

    @classmethod
    def _windowed(cls, mcfg, config, device, max_model_len: int, windows, cache) -> KVPool:
        """A pool whose window layers have their own pages. With ``num_pages`` set the window
        pool gets ``window_pages`` (default: as many); from a budget, ``WINDOW_SHARE`` window
        pages per full page, at least two requests' worth of window, at most one per full
        page, and the budget pays for both."""
        dtype, P = DTYPES[config.dtype], config.page_size
        window = max(mcfg.window(i) for i in windows)
        one = window_pages_needed(window, P, config.max_batch_tokens)
        if config.num_pages is not None:
            num_pages = config.num_pages
            wpages = config.window_pages or num_pages
        else:
            H, D = mcfg.num_kv_heads, mcfg.head_dim
            full = kv_bytes_per_token(mcfg.num_layers - len(windows), H, D, dtype)
            win = kv_bytes_per_token(len(windows), H, D, dtype)
            budget = config.kv_memory_bytes or default_kv_budget(device)
            cap = -(-config.max_running * max_model_len // P)
            per_token = max(1, int(full + WINDOW_SHARE * win))
            num_pages = max(2, min(pages_for_budget(budget, P, per_token), cap))
            wpages = min(num_pages, max(int(WINDOW_SHARE * num_pages), 2 * one))
        wpages = max(wpages, one)  # one request's chunk must always fit
        shape = (mcfg.num_layers, num_pages, P, mcfg.num_kv_heads, mcfg.head_dim)
        host_pages = _host_pages(config, mcfg, device, num_pages, reuse=cache == "swa_radix")
        # the host window pool: the device pools' ratio of window pages to full pages
        host_wpages = -(-host_pages * wpages // num_pages) + 1 if host_pages else 0
        return cls(
            *shape,
            dtype,
            device,
            host_pages,
            window_layers=tuple(windows),
            window_pages=wpages + 1,  # + the NULL page
            window=window,
            host_window_pages=host_wpages,
        )

    @property
    def nbytes(self) -> int:
        return 2 * self.k_cache.numel() * self.k_cache.element_size() + self.window_nbytes

    @property
    def window_nbytes(self) -> int:
        if self.window_k is None:
            return 0
        return 2 * self.window_k.numel() * self.window_k.element_size()

    @property
    def page_bytes(self) -> int:
        """K and V bytes of one page, all layers (of the full pool: the host tier's unit)."""
        return 2 * self.k_cache.numel() * self.k_cache.element_size() // self.num_pages

    @property
    def window_page_bytes(self) -> int:
        """K and V bytes of one window-pool page, all window layers (0 without a window pool)."""
        return self.window_nbytes // self.window_k.shape[1] if self.window_k is not None else 0

    def held_bytes(self, pages) -> int:
        """KV bytes that the full ``pages`` of a sequence hold in both pools, from the
        allocator's accounting (a page whose window page was dropped costs its full part)."""
        pages = list(pages)
        n = len(pages) * self.page_bytes
        if self.window_k is not None:
            n += sum(map(self.allocator.has_window, pages)) * self.window_page_bytes
        return n

    def run_copies(self, copies) -> int:
        """Run the cache's recorded copies (``host_tier.PageCopy``) now, in order, every layer
        (after any staged ones); the bytes moved."""
        if not copies or self.copier is None:
            return 0
        copies, moved = self._state_copies(copies)
        return moved + (self.copier.run(copies) if copies else 0)

    def _state_copies(self, copies) -> tuple[list, int]:
        """Run the state-slot copies among ``copies`` now (``StatePool.host_copies``: on the
        current stream, so before the next forward and in order with every step's own state
        copies; KV and state copies touch different memory, so splitting keeps each in its
        order); return the KV copies and the state bytes moved."""
        state = [c for c in copies if c.state]
        if not state:
            return copies, 0
        return [c for c in copies if not c.state], self.state_pool.host_copies(state)

    def make_cache(self, kind: str, config, state_pool=None) -> PrefixCache:
        """The prefix cache of ``kind`` on this pool for an ``EngineConfig``
        (``cache_index.make_cache``): its allocator, and for a reusing cache its eviction,
        events and host tier; for ``mamba_radix`` the state pool's slot ids too (``state_pool``:
        the engine's ``StatePool``), and with a host tier host state slots beside the host
        pages (``StatePool.host_slots_for``)."""
        kw: dict = {"allocator": self.allocator}
        if kind == "mamba_radix":
            kw["state_allocator"] = state_pool.allocator
            if self.host_allocator is not None:
                n = state_pool.host_slots_for(self.host_pages, self.num_pages)
                kw["host_state_allocator"] = state_pool.add_host(n)
                self.state_pool = state_pool
        if kind != "chunk":
            kw.update(
                eviction=config.eviction,
                enable_events=config.enable_events,
                host_allocator=self.host_allocator,
            )
            if kind == "radix" and config.host_write_through_hits is not None:
                kw["host_write_through_hits"] = config.host_write_through_hits
        return make_cache(kind, self.page_size, **kw)

    def host_copies(
        self, copies, layered: bool = False, wait: bool = False
    ) -> tuple[list[Copied], float]:
        """Complete any staged copies, then hand over ``copies``: ``layered``, staged for the
        next forward, which runs layer ``i``'s before layer ``i`` (``host_copies.py``); else run
        now. Returns the batches done (``wait``: every one, CUDA waiting for its copy stream)
        and the seconds the forward spent on copies (``HostCopies.finish``)."""
        if self.copier is None:
            return [], 0.0
        if copies:
            copies, _ = self._state_copies(copies)
        done, held = self.copier.finish(wait and not copies)
        if copies:
            self.copier.stage(copies)
            if not layered:
                more, more_held = self.copier.finish(wait)
                done, held = done + more, held + more_held
        return done, held

    def before_layer(self, i: int) -> None:
        """The forward's hook: model layer ``i`` is about to use its KV (None-safe alias)."""
        if self.copier is not None:
            self.copier.before_layer(self.kv_index[i] if self.kv_index else i)

    def copy_pages(self, pairs: list[tuple[int, int]]) -> None:
        """Copy each (source, destination) page's K and V, every layer (a sample forked from
        another gets its own copy of the partial page it will write)."""
        if not pairs:
            return
        dev = self.k_cache.device
        src = torch.tensor([a for a, _ in pairs], device=dev)
        dst = torch.tensor([b for _, b in pairs], device=dev)
        self.k_cache[:, dst] = self.k_cache[:, src]
        self.v_cache[:, dst] = self.v_cache[:, src]
        if self.window_k is not None:
            table = self.allocator.window_table
            src = torch.tensor(table([a for a, _ in pairs]), device=dev)
            dst = torch.tensor(table([b for _, b in pairs]), device=dev)
            self.window_k[:, dst] = self.window_k[:, src]
            self.window_v[:, dst] = self.window_v[:, src]
