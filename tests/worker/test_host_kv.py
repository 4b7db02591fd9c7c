"""The host tier's K/V in the pool: copies of page lists out to the host and back, in order."""

from __future__ import annotations

import pytest
import torch

from radixray.cache_index.host_tier import PageCopy
from radixray.worker.memory_pool import KVPool


def _pool(device: str, host_pages: int = 6) -> KVPool:
    pool = KVPool(2, 5, 4, 2, 8, torch.float32, device, host_pages)
    g = torch.Generator().manual_seed(0)
    pool.k_cache.copy_(torch.randn(pool.k_cache.shape, generator=g))
    pool.v_cache.copy_(torch.randn(pool.v_cache.shape, generator=g))
    return pool


def _round_trip(device: str) -> None:
    pool = _pool(device)
    k0, v0 = pool.k_cache.clone(), pool.v_cache.clone()
    # page 1 out to host 4, page 3 out to host 0; then device page 1 is reused (overwritten)
    # and host 4 is loaded into device page 2, host 0 into device page 1
    copies = [PageCopy(True, [1, 3], [4, 0]), PageCopy(False, [4, 0], [2, 1])]
    moved = pool.run_copies(copies)
    if device == "cuda":
        torch.cuda.synchronize()
    assert moved == 4 * pool.page_bytes
    assert torch.equal(pool.host.k[4].to(device), k0[:, 1]) and torch.equal(
        pool.host.v[0].to(device), v0[:, 3]
    )
    assert torch.equal(pool.k_cache[:, 2], k0[:, 1]) and torch.equal(pool.v_cache[:, 2], v0[:, 1])
    assert torch.equal(pool.k_cache[:, 1], k0[:, 3]) and torch.equal(pool.v_cache[:, 1], v0[:, 3])
    assert torch.equal(pool.k_cache[:, [0, 3, 4]], k0[:, [0, 3, 4]])  # nothing else written


def test_copies_out_and_back_in_order_cpu():
    _round_trip("cpu")


def test_runs_of_consecutive_pages_copy_as_slices():
    pool = _pool("cpu")
    k0 = pool.k_cache.clone()
    pool.run_copies([PageCopy(True, [0, 1, 2, 4], [2, 3, 4, 0])])
    pool.run_copies([PageCopy(False, [2, 3, 4, 0], [1, 2, 3, 0])])
    assert torch.equal(pool.k_cache[:, [1, 2, 3, 0]], k0[:, [0, 1, 2, 4]])


def test_no_host_tier_means_no_copies():
    pool = KVPool(2, 5, 4, 2, 8)
    assert pool.host is None and pool.host_allocator is None
    assert pool.run_copies([]) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_copies_out_and_back_in_order_cuda():
    _round_trip("cuda")
    assert _pool("cuda").host.k.is_pinned()
