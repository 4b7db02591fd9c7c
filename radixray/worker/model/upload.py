"""Host lists to device tensors without waiting for the device.

A plain copy from host memory to CUDA (``torch.tensor(data, device="cuda")``, ``.to("cuda")``)
waits for every kernel queued before it: the host would stop there until the step in flight is
done, which undoes the overlapped step (``worker/overlap.py``). ``upload`` builds the tensor in
pinned host memory and copies it without waiting; the caching host allocator keeps that memory
until the copy has run. Off CUDA it builds the tensor where it is used.
"""

from __future__ import annotations

import torch

__all__ = ["upload"]


def upload(data, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """``torch.tensor(data, dtype=dtype)`` on ``device``, never waiting for it."""
    device = torch.device(device)
    if device.type != "cuda":
        return torch.tensor(data, dtype=dtype, device=device)
    return torch.tensor(data, dtype=dtype, pin_memory=True).to(device, non_blocking=True)
