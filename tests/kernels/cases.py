"""Random paged-attention inputs shared by the kernel tests (CPU, interpreter and GPU).

Every tensor is random (never zeros); pages are handed out in a random order so block tables are
non-contiguous; block-table entries past a sequence's last page are -1 (never to be read).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

# Tolerances against the float32 reference, by the dtype the kernel reads and writes. fp32: the
# kernels accumulate in a different order (online softmax, split merge). fp16/bf16: the output is
# rounded once (half an ulp) and P is rounded to the input dtype before P @ V, as in flash-attn.
TOLERANCE = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float16: {"atol": 3e-3, "rtol": 3e-3},
    torch.bfloat16: {"atol": 3e-2, "rtol": 2e-2},
}


def edge_lengths(page_size: int, many_pages: int = 3) -> list[int]:
    """1, P-1, P, P+1 and a length spanning many pages (duplicates and zeros removed)."""
    P = page_size
    lens = [1, P - 1, P, P + 1, many_pages * P + max(1, P // 2)]
    return sorted({n for n in lens if n >= 1})


@dataclass
class PagedKV:
    k_cache: torch.Tensor  # [num_pages, P, Hkv, D]
    v_cache: torch.Tensor
    block_table: torch.Tensor  # int32 [B, max_pages], -1 past each sequence's pages
    seq_lens: torch.Tensor  # int32 [B]


def make_paged_kv(
    lens: list[int],
    page_size: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: str | torch.device,
    gen: torch.Generator,
    spare_pages: int = 3,
    pad_value: int = -1,
) -> PagedKV:
    P = page_size
    need = [(n + P - 1) // P for n in lens]
    num_pages = sum(need) + spare_pages
    shape = (num_pages, P, kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
    v_cache = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
    order = torch.randperm(num_pages, generator=gen).tolist()
    width = max(need) + 1  # one spare column: the kernels must stop at each sequence's end
    table = torch.full((len(lens), width), pad_value, dtype=torch.int32)
    used = 0
    for b, n in enumerate(need):
        table[b, :n] = torch.tensor(order[used : used + n], dtype=torch.int32)
        used += n
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    return PagedKV(k_cache, v_cache, table.to(device), seq_lens.to(device))


def make_query(n: int, heads: int, head_dim: int, dtype, device, gen) -> torch.Tensor:
    # scaled up so that softmax is peaked: a uniform softmax hides indexing mistakes
    return (2 * torch.randn(n, heads, head_dim, generator=gen)).to(device=device, dtype=dtype)


def make_cu_seqlens(q_lens: list[int], device) -> torch.Tensor:
    cu = [0]
    for n in q_lens:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def nan_like(t: torch.Tensor) -> torch.Tensor:
    """An output buffer poisoned with NaN: any element a kernel forgets to write fails."""
    return torch.full_like(t, float("nan"))


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert not torch.isnan(actual).any(), "output has NaN: an element was not written"
    torch.testing.assert_close(actual.float(), expected.float(), **TOLERANCE[dtype])


def run_cases_in_subprocess(test_file: str, env_flag: str) -> None:
    """Run ``test_file``'s ``case_`` tests in one fresh pytest process with ``env_flag`` set: on
    CUDA compiled, else under ``TRITON_INTERPRET=1`` (which must be set before triton is first
    imported, hence the process). Every case must pass, none skip."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"} | {env_flag: "1"}
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file, "-k", "case_"]
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-6000:]}"
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]
