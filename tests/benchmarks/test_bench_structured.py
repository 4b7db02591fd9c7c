"""bench_structured: the libraries are measured alternated (A B, B A, ...), and the engine runs
its JSON-schema grammar with each library (xgrammar through the benchmark's adapter, where it is
installed), both keeping the output inside the grammar."""

from __future__ import annotations

import importlib.util
import json
import runpy
from pathlib import Path

import pytest

BENCH = runpy.run_path(str(Path(__file__).resolve().parents[2] / "benchmarks/bench_structured.py"))
HAVE_XGR = importlib.util.find_spec("xgrammar") is not None


def test_the_libraries_alternate_every_round(monkeypatch):
    order: list[tuple[str, str]] = []
    glb = BENCH["_library_rounds"].__globals__
    monkeypatch.setitem(glb, "_import_ms", lambda lib, runs: order.append((lib, "import")) or 1.0)
    monkeypatch.setitem(glb, "_measure", lambda cls, meta, docs: order.append((cls.name, meta)))
    libs = [BENCH["_Xgr"], BENCH["_Llg"]]
    got = BENCH["_library_rounds"](libs, {"tiny": "m"}, 4, 1)
    leads = [lib for lib, what in order if what == "import"]
    assert leads == ["xgrammar", "llguidance", "llguidance", "xgrammar"] * 2
    assert (
        len(got["imports"]["xgrammar"]) == 4 and len(got["measured"][("llguidance", "tiny")]) == 4
    )


def test_the_engine_rounds_rotate_and_measure_each_library():
    libs = [c for c in (BENCH["_Xgr"], BENCH["_Llg"]) if c is BENCH["_Llg"] or HAVE_XGR]
    got = BENCH["_engine_rounds"]("tiny", libs, 2, 4, 3)
    assert list(got) == ["free", *(c.name for c in libs)]
    assert all(len(v) == 3 and min(v) > 0 for v in got.values())


@pytest.mark.skipif(not HAVE_XGR, reason="xgrammar is not installed (not a dependency)")
def test_xgrammar_through_the_engine_stays_in_the_schema():
    from radixray.protocol import GrammarSpec, SamplingParams
    from radixray.worker import Engine, EngineConfig
    from radixray.worker.grammar import GrammarCompiler

    engine = Engine(EngineConfig(model="tiny", device="cpu", seed=0))
    spec = GrammarSpec("json_schema", BENCH["ENGINE_SCHEMA"])
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=1, ignore_eos=True, grammar=spec)
    vocab = engine.model_config.vocab_size
    for compiler in (BENCH["_XgrCompiler"], GrammarCompiler):
        BENCH["_use"](engine, compiler(engine.tokenizer, vocab))
        for out in engine.generate_batch(["a", "b"], params):
            assert len(out.token_ids) == 12 and out.text.startswith('[{"name":"'), out.text
    engine.shutdown()
    assert json.loads(BENCH["ENGINE_SCHEMA"])["minItems"] == 64
