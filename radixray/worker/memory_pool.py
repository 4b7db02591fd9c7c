"""The KV memory pool: one K and one V tensor for all layers, plus the page allocator.

    k_cache, v_cache: [num_layers, num_pages, page_size, num_kv_heads, head_dim]

``k_cache[l]`` is the per-layer view the kernels take ([num_pages, P, Hkv, D], the layout of
vLLM's flash-attn fork). Page ids index dimension 1 and are handed out by ``PageAllocator``.
"""

from __future__ import annotations

import torch

from radixray.cache_index import PageAllocator

__all__ = ["KVPool", "kv_bytes_per_token", "pages_for_budget"]


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype) -> int:
    return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def pages_for_budget(budget_bytes: int, page_size: int, bytes_per_token: int) -> int:
    return max(1, budget_bytes // (page_size * bytes_per_token))


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
        self.k_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.v_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.allocator = PageAllocator(num_pages)
        self.page_size = page_size
        self.num_pages = num_pages

    @property
    def nbytes(self) -> int:
        return 2 * self.k_cache.numel() * self.k_cache.element_size()
