"""The KV memory pool: one K and one V tensor for all layers, plus the page allocator; and the
host tier's K and V (docs/host_tier.md) with the copies between them.

    k_cache, v_cache: [num_layers, num_pages, page_size, num_kv_heads, head_dim]
    host_k, host_v:   [host_pages, num_layers, page_size, num_kv_heads, head_dim]

``k_cache[l]`` is the per-layer view the kernels take ([num_pages, P, Hkv, D], the layout of
vLLM's flash-attn fork). Page ids index dimension 1 and are handed out by ``PageAllocator``. A
host page is one contiguous block (all layers), so a page moves as one piece of memory. On CUDA
the host tensors are pinned and the copies run on their own stream; the forward's stream waits
for them.
"""

from __future__ import annotations

import math
import mmap

import torch

from radixray.cache_index import PageAllocator

__all__ = [
    "KVPool",
    "kv_bytes_per_token",
    "pages_for_budget",
    "default_kv_budget",
    "default_host_pages",
    "DTYPES",
]

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Without a configured budget a CPU pool takes at most this much, and at most a quarter of the
# available memory: the same machine runs the model, Ray and often another worker.
_CPU_DEFAULT_BUDGET = 2 << 30
# On a GPU the pool takes this share of the memory left free after the weights are loaded.
_GPU_MEMORY_SHARE = 0.85


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


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
    """A zeroed tensor. On the CPU from an anonymous memory map, which the kernel hands out as
    zero pages on first touch: ``torch.zeros`` writes every byte up front, and a default 2 GB CPU
    pool per worker took seconds of a worker's start (more with two workers on 2 cores) for
    pages most runs never use."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = itemsize * math.prod(shape)
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    buf = mmap.mmap(-1, nbytes)  # MAP_ANONYMOUS | MAP_PRIVATE: zero-filled by the kernel
    # The tensor holds the map alive; frombuffer shares its memory (no copy).
    return torch.frombuffer(buf, dtype=dtype).view(shape)


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
    ):
        shape = (num_layers, num_pages, page_size, num_kv_heads, head_dim)
        self.k_cache = _zeros(shape, dtype, device)
        self.v_cache = _zeros(shape, dtype, device)
        self.allocator = PageAllocator(num_pages)
        self.page_size = page_size
        self.num_pages = num_pages
        self.host_pages = host_pages
        self.host = HostKV(self.k_cache, self.v_cache, host_pages) if host_pages else None
        self.host_allocator = PageAllocator(host_pages) if host_pages else None

    @classmethod
    def for_model(cls, mcfg, config, device: torch.device, max_model_len: int) -> KVPool:
        """Size a pool for a ModelConfig under an EngineConfig: ``num_pages`` if set, else the
        memory budget, capped at what ``max_running`` sequences of ``max_model_len`` could ever
        use (a tiny test model must not allocate gigabytes)."""
        dtype = DTYPES[config.dtype]
        P = config.page_size
        if config.num_pages is not None:
            num_pages = config.num_pages
        else:
            per_token = kv_bytes_per_token(mcfg.num_layers, mcfg.num_kv_heads, mcfg.head_dim, dtype)
            budget = config.kv_memory_bytes or default_kv_budget(device)
            cap = -(-config.max_running * max_model_len // P)
            num_pages = max(2, min(pages_for_budget(budget, P, per_token), cap))
        host_pages = config.host_pages
        if host_pages is None:
            per_token = kv_bytes_per_token(mcfg.num_layers, mcfg.num_kv_heads, mcfg.head_dim, dtype)
            host_pages = default_host_pages(device, num_pages, P * per_token)
        if config.cache != "radix":
            host_pages = 0  # no reuse, nothing to keep
        shape = (mcfg.num_layers, num_pages, P, mcfg.num_kv_heads, mcfg.head_dim)
        return cls(*shape, dtype, device, host_pages)

    @property
    def nbytes(self) -> int:
        return 2 * self.k_cache.numel() * self.k_cache.element_size()

    @property
    def page_bytes(self) -> int:
        """K and V bytes of one page, all layers."""
        return self.nbytes // self.num_pages

    def run_copies(self, copies) -> int:
        """Run the cache's recorded copies (``host_tier.PageCopy``), in order; the bytes moved."""
        if not copies or self.host is None:
            return 0
        self.host.run(copies)
        return sum(len(c.src) for c in copies) * self.page_bytes

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


class HostKV:
    """The host tier's K and V and the copies of page lists to and from the device pool."""

    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor, host_pages: int):
        L, _, P, H, D = k_cache.shape
        shape = (host_pages, L, P, H, D)
        self.device = k_cache.device
        self.dev = (k_cache, v_cache)
        cuda = self.device.type == "cuda"
        if cuda:  # pinned: the copies are DMA, asynchronous to the host thread
            self.k = torch.zeros(shape, dtype=k_cache.dtype, pin_memory=True)
            self.v = torch.zeros(shape, dtype=k_cache.dtype, pin_memory=True)
        else:
            self.k = _zeros(shape, k_cache.dtype, "cpu")
            self.v = _zeros(shape, k_cache.dtype, "cpu")
        self._stream = torch.cuda.Stream(self.device) if cuda else None

    def run(self, copies) -> None:
        if self._stream is None:
            for c in copies:
                (self.copy_out if c.to_host else self.copy_in)(c.src, c.dst)
            return
        # CUDA: the copies wait for what the forward stream queued before (the pages a
        # demotion reads were written by earlier steps) and the forward waits for them (the
        # pages a load-back writes are read by this step; a demoted page is reused by it).
        cur = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(cur)
        with torch.cuda.stream(self._stream):
            for c in copies:
                (self.copy_out if c.to_host else self.copy_in)(c.src, c.dst)
        done = torch.cuda.Event()
        done.record(self._stream)
        cur.wait_event(done)

    def copy_out(self, src: list[int], dst: list[int]) -> None:
        """Device pages ``src`` -> host pages ``dst``, one slice copy per run of consecutive
        pages on both sides (a gather through index_select ran at 1/15 of memcpy's speed)."""
        for s0, d0, n in _runs(src, dst):
            for dev, host in zip(self.dev, (self.k, self.v), strict=True):
                block = dev[:, s0 : s0 + n].transpose(0, 1)
                if self._stream is not None:  # contiguous on the GPU, then one DMA to pinned
                    block = block.contiguous()
                host[d0 : d0 + n].copy_(block, non_blocking=self._stream is not None)

    def copy_in(self, src: list[int], dst: list[int]) -> None:
        """Host pages ``src`` -> device pages ``dst``, by runs as ``copy_out``."""
        for s0, d0, n in _runs(src, dst):
            for dev, host in zip(self.dev, (self.k, self.v), strict=True):
                block = host[s0 : s0 + n]
                if self._stream is not None:  # one DMA from pinned memory, then a GPU copy
                    block = block.to(self.device, non_blocking=True)
                dev[:, d0 : d0 + n].copy_(block.transpose(0, 1))


def _runs(src: list[int], dst: list[int]) -> list[tuple[int, int, int]]:
    """``(src_start, dst_start, length)`` of the maximal runs where both ids go up by one."""
    runs: list[tuple[int, int, int]] = []
    for a, b in zip(src, dst, strict=True):
        if runs:
            s0, d0, n = runs[-1]
            if a == s0 + n and b == d0 + n:
                runs[-1] = (s0, d0, n + 1)
                continue
        runs.append((a, b, 1))
    return runs
