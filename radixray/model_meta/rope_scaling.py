"""RoPE scaling as per-frequency divisors of the inverse frequencies (torch-free): what a
checkpoint's ``rope_scaling`` / ``rope_parameters`` asks for, in the form llama.cpp stores in a
GGUF (``rope_freqs.weight``: ``inv_freq[i] / factors[i]``).

    linear   every frequency divided by ``factor``
    llama3   Llama 3.1's: long wavelengths (> original context / low_freq_factor) divided by
             ``factor``, short ones (< original context / high_freq_factor) kept, the ones in
             between interpolated (transformers' ``_compute_llama3_parameters``)
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["SCALED_ROPE_TYPES", "rope_freq_factors"]

SCALED_ROPE_TYPES = ("linear", "llama3")


def rope_freq_factors(params: dict[str, Any], head_dim: int, theta: float) -> tuple[float, ...]:
    """The ``head_dim // 2`` divisors for a ``rope_type`` of ``SCALED_ROPE_TYPES``."""
    kind = params.get("rope_type") or params.get("type")
    factor = float(params["factor"])
    n = head_dim // 2
    if kind == "linear":
        return (factor,) * n
    if kind != "llama3":
        raise ValueError(f"RoPE scaling {kind!r} is not one of {SCALED_ROPE_TYPES}")
    low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
    context = float(params["original_max_position_embeddings"])
    out = []
    for i in range(n):
        wavelen = 2 * math.pi * theta ** (2 * i / head_dim)
        if wavelen < context / high:
            out.append(1.0)
        elif wavelen > context / low:
            out.append(factor)
        else:
            smooth = (context / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return tuple(out)
