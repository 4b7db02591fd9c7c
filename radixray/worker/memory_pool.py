"""The KV memory pool: one K and one V tensor for all layers, plus the page allocator.

    k_cache, v_cache: [num_layers, num_pages, page_size, num_kv_heads, head_dim]

``k_cache[l]`` is the per-layer view the kernels take ([num_pages, P, Hkv, D], the layout of
vLLM's flash-attn fork). Page ids index dimension 1 and are handed out by ``PageAllocator``.
"""

from __future__ import annotations

import math
import mmap

import torch

from radixray.cache_index import PageAllocator

__all__ = ["KVPool", "kv_bytes_per_token", "pages_for_budget", "default_kv_budget", "DTYPES"]

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
    ):
        shape = (num_layers, num_pages, page_size, num_kv_heads, head_dim)
        self.k_cache = _zeros(shape, dtype, device)
        self.v_cache = _zeros(shape, dtype, device)
        self.allocator = PageAllocator(num_pages)
        self.page_size = page_size
        self.num_pages = num_pages

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
        return cls(mcfg.num_layers, num_pages, P, mcfg.num_kv_heads, mcfg.head_dim, dtype, device)

    @property
    def nbytes(self) -> int:
        return 2 * self.k_cache.numel() * self.k_cache.element_size()

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
