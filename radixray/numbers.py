"""Small statistics both sides use: a percentile and an exponentially weighted moving average.

Pure Python, no dependencies: the worker's meters, the routing policies, the simulator and the
benchmark reports all take them from here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["percentile", "Ewma"]


def percentile(values: Iterable[float | None], q: float, empty: float | None = math.nan):
    """Linear-interpolated percentile (numpy's default), ``q`` in [0, 100]; ``None`` values are
    left out; ``empty`` is the answer when nothing is left (nan, or None for JSON reports)."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return empty
    k = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class Ewma:
    """Exponentially weighted moving average: each sample weighs ``alpha``, the past ``1 -
    alpha``. ``value`` is ``initial`` until the first sample (None: the first sample itself)."""

    def __init__(self, alpha: float = 0.2, initial: float | None = None):
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self.keep = 1.0 - alpha
        self.value = initial

    def update(self, x: float) -> float:
        self.value = x if self.value is None else self.keep * self.value + self.alpha * x
        return self.value
