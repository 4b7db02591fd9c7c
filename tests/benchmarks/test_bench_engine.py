"""bench_engine's parent, with fake children: the order of radixray and the two HF variants
rotates every run, and the peer quoted is the better HF variant, named."""

from __future__ import annotations

import runpy
from pathlib import Path
from types import SimpleNamespace

BENCH = runpy.run_path(str(Path(__file__).resolve().parents[2] / "benchmarks/bench_engine.py"))


class FakeChild:
    """Answers decode and ttft at a fixed tokens/s per side; records the calls."""

    def __init__(self, calls: list, speeds: dict[str, float]):
        self.calls, self.speeds = calls, speeds

    def call(self, cmd: str, cache: str | None = None, **kw):
        side = f"hf_{cache}" if cache else "radixray"
        self.calls.append((side, cmd))
        speed = self.speeds[side]
        if cmd == "ttft":
            return {"cold_s": 1 / speed, "cached_s": 0.1 / speed, "cached_tokens": 9,
                    "prompt_tokens": 10}  # fmt: skip
        outputs = [[1, 2, 3] for _ in kw["prompts"]]
        return {"tokens_per_s": speed, "ms_per_step": 1e3 / speed, "outputs": outputs}


def _measure(runs: int, speeds: dict[str, float]):
    calls: list = []
    args = SimpleNamespace(runs=runs, batches=[1, 2], max_tokens=4)
    prompts = {1: [[5]], 2: [[5], [6]]}
    radix, hf = FakeChild(calls, speeds), FakeChild(calls, speeds)
    sides, got, _ = BENCH["_measure"](args, radix, hf, prompts, [5, 6])
    return sides, got, calls


def test_the_order_rotates_every_run():
    speeds = {"radixray": 20.0, "hf_dynamic": 10.0, "hf_static": 12.0}
    sides, runs, calls = _measure(3, speeds)
    assert sides == ["radixray", "hf_dynamic", "hf_static"]
    assert [r["order"][0] for r in runs] == sides  # each side leads one run
    timed = [s for s, _ in calls[len(sides) :]]  # after one warm-up call per side
    per_run = len(sides) * 3  # 2 batches and the TTFT
    for k, r in enumerate(runs):
        mine = timed[k * per_run : (k + 1) * per_run]
        assert mine == r["order"] * 3


def test_the_peer_is_the_better_hf_variant():
    speeds = {"radixray": 20.0, "hf_dynamic": 10.0, "hf_static": 12.5}
    sides, runs, _ = _measure(2, speeds)
    row = BENCH["_decode_row"]({s: [r["decode"][1][s] for r in runs] for s in sides})
    assert row["peer"] == "hf_static"
    assert row["hf_static"]["speedup"] == 1.6 and row["hf_dynamic"]["speedup"] == 2.0
    assert row["hf_static"]["agreement"] == 1.0
    ttft = BENCH["_ttft"](runs, sides)
    assert ttft["peer"] == "hf_static" and ttft["hf_cold_s"]["hf_static"] == 1 / 12.5
