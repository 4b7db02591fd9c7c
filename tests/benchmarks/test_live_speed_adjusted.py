"""live_speed_adjusted's fit: two targets' runs compared at the same step period (hand-made runs
with a known ratio and elasticity; the quick run in test_quick.py does it on live runs)."""

from __future__ import annotations

import math
import random
import runpy
from pathlib import Path

import pytest

STUDY = runpy.run_path(
    str(Path(__file__).resolve().parents[2] / "benchmarks/studies/live_speed_adjusted.py")
)


def _runs(steps, ratio, elasticity, noise, rng):
    out = []
    for s in steps:
        p50 = ratio * 2.0 * s**elasticity * math.exp(rng.gauss(0, noise))
        out.append({"step_period_ms": s, "ttft_p50_s": p50})
    return out


def test_an_exact_power_law_gives_back_its_ratio_and_elasticity():
    rng = random.Random(0)
    # the first target ran on a faster machine: raw it looks 1.5x better, adjusted 1.2x worse
    first = _runs([2.7, 2.8, 2.9], 1.2, 3.0, 0.0, rng)
    second = _runs([3.3, 3.4, 3.5], 1.0, 3.0, 0.0, rng)
    fit = STUDY["adjusted_ratio"](first, second, "ttft_p50_s")
    assert fit["ratio"] == pytest.approx(1.2, rel=1e-9)
    assert fit["elasticity"] == pytest.approx(3.0, rel=1e-9)
    assert fit["low"] == pytest.approx(1.2, rel=1e-6) and fit["high"] == pytest.approx(
        1.2, rel=1e-6
    )
    assert fit["runs"] == 6


def test_the_interval_covers_the_true_ratio_in_about_95_percent_of_noisy_sets():
    rng = random.Random(1)
    covered = 0
    for _ in range(400):
        steps = [rng.uniform(2.8, 3.6) for _ in range(12)]
        first = _runs(steps[:6], 0.9, 2.5, 0.15, rng)
        second = _runs(steps[6:], 1.0, 2.5, 0.15, rng)
        fit = STUDY["adjusted_ratio"](first, second, "ttft_p50_s")
        covered += fit["low"] <= 0.9 <= fit["high"]
    assert 0.91 <= covered / 400 <= 0.99


def test_too_few_runs_and_bad_dof_are_refused():
    rng = random.Random(2)
    with pytest.raises(ValueError, match="at least 4 runs"):
        STUDY["adjusted_ratio"](
            _runs([3.0], 1, 1, 0, rng), _runs([3.1, 3.2], 1, 1, 0, rng), "ttft_p50_s"
        )
    with pytest.raises(ValueError, match="dof must be >= 1"):
        STUDY["t975"](0)
    assert STUDY["t975"](11) == 2.228 and STUDY["t975"](1000) == 1.96
