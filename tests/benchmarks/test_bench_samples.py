"""bench_samples' variants on the tiny model: n=N computes the prompt once, and the emulation of
SGLang's fan-out runs at page size 1, where each copy computes only the last prompt token."""

from __future__ import annotations

import random
import runpy
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = runpy.run_path(str(Path(__file__).resolve().parents[2] / "benchmarks/bench_samples.py"))
PROMPT, N = 40, 4


@pytest.fixture(scope="module")
def engines():
    args = SimpleNamespace(model="tiny", prompt_len=PROMPT, n=N, unshared=True)
    out = BENCH["_engines"](args)
    yield out
    for eng in out.values():
        eng.shutdown()


def _computed(engines, variant: str) -> int:
    eng = engines[BENCH["ENGINE"][variant]]
    prompt = [random.Random(variant).randrange(10, 300) for _ in range(PROMPT)]
    before = eng.meter.prefill_tokens
    assert BENCH["_first_tokens"](eng, variant, prompt, N) > 0
    assert not eng.has_work()
    return eng.meter.prefill_tokens - before


def test_the_fanout_is_emulated_at_page_size_one(engines):
    assert engines["page1"].page_size == 1 and engines["page16"].page_size == 16
    # the prefix request computes the prompt; each of the N copies its last token only
    assert _computed(engines, BENCH["FANOUT"]) == PROMPT + N


def test_n_samples_compute_the_prompt_once(engines):
    assert _computed(engines, BENCH["NN"]) == PROMPT
    assert _computed(engines, BENCH["N1_PAGE1"]) == PROMPT


def test_the_unshared_row_is_labelled_as_no_engine(engines):
    assert "no current engine does this" in BENCH["UNSHARED"]
    assert _computed(engines, BENCH["UNSHARED"]) == PROMPT * N
    assert BENCH["_label"](BENCH["FANOUT"], 8).startswith("8 requests, SGLang fan-out (emulated")
