"""Structured output: the two grammar libraries side by side (xgrammar, llguidance).

For each library that is installed: its install size (package folders), import time (a fresh
interpreter), the tokenizer set-up and the grammar compile time for a nested JSON schema on the
tiny model's byte vocabulary (320 ids) and on SmolLM2's (49,152), and the per-token mask cost:
the median microseconds to compute the next-token bitmask and apply it to one logits row,
walking a valid document token by token.

    .venv/bin/python benchmarks/bench_structured.py            # 5 import runs, 3 documents
    .venv/bin/python benchmarks/bench_structured.py --quick    # 1 import run, tiny model only
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from radixray.model_meta import load_model_meta
from radixray.worker.grammar_vocab import vocab_of
from radixray.worker.sampler import apply_token_bitmask

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "role", "tags", "address"],
    "additionalProperties": False,
}
DOC = {
    "name": "Ada",
    "age": 36,
    "role": "admin",
    "tags": ["math", "engines"],
    "address": {"city": "London", "zip": "W1"},
}
PACKAGES = {"xgrammar": ["xgrammar", "tvm_ffi"], "llguidance": ["llguidance"]}


def _size_mb(lib: str) -> float:
    total = 0
    for pkg in PACKAGES[lib]:
        spec = importlib.util.find_spec(pkg)
        if spec is None or not spec.submodule_search_locations:
            continue
        for folder in spec.submodule_search_locations:
            total += sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())
    return total / 2**20


def _import_ms(lib: str, runs: int) -> float:
    """Median import time in a fresh interpreter that has torch imported already (a worker)."""
    code = (
        "import time, torch; t = time.perf_counter(); import " + lib + "; "
        "print((time.perf_counter() - t) * 1e3)"
    )
    out = [
        float(subprocess.check_output([sys.executable, "-c", code], text=True)) for _ in range(runs)
    ]
    return statistics.median(out)


class _Xgr:
    name = "xgrammar"

    def __init__(self, vocab, size):
        import xgrammar as xgr

        self.xgr = xgr
        # special ids as empty strings: xgrammar treats those as special (never in a grammar)
        enc = [b"" if i in vocab.special_ids else t for i, t in enumerate(vocab.tokens)]
        info = xgr.TokenizerInfo(
            enc, xgr.VocabType.RAW, vocab_size=size, stop_token_ids=list(vocab.stop_ids)
        )
        self.compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, schema: str):
        return self.compiler.compile_json_schema(schema)

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, m, bitmask):
        m.fill_next_token_bitmask(bitmask, 0)

    def accept(self, m, tok):
        assert m.accept_token(tok)


class _Llg:
    name = "llguidance"

    def __init__(self, vocab, size):
        import llguidance

        from radixray.worker.grammar import llg_tokenizer

        self.llg = llguidance
        self.tok = llg_tokenizer(vocab)

    def compile(self, schema: str):
        grammar = self.llg.LLMatcher.grammar_from_json_schema(schema)
        self.llg.LLMatcher.validate_grammar(grammar, self.tok)
        return grammar

    def matcher(self, compiled):
        return self.llg.LLMatcher(self.tok, compiled, log_level=0)

    def fill(self, m, bitmask):
        row = bitmask[0]
        m.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * 4)

    def accept(self, m, tok):
        assert m.consume_token(tok), m.get_error()


def _measure(cls, meta, docs: int) -> dict:
    size = meta.config.vocab_size
    vocab = vocab_of(meta.tokenizer, size)
    t0 = time.perf_counter()
    lib = cls(vocab, size)
    setup_ms = (time.perf_counter() - t0) * 1e3
    text = json.dumps(DOC)
    t0 = time.perf_counter()
    compiled = lib.compile(json.dumps(SCHEMA))
    compile_ms = (time.perf_counter() - t0) * 1e3
    ids = meta.tokenizer.encode(text)
    bitmask = torch.full((1, (size + 31) // 32), -1, dtype=torch.int32)
    logits = torch.zeros(1, size)
    t0 = time.perf_counter()
    lib.fill(lib.matcher(compiled), bitmask)
    first_ms = (time.perf_counter() - t0) * 1e3  # llguidance builds its lexer lazily, here
    per_token: list[float] = []
    for _ in range(docs):
        m = lib.matcher(compiled)
        for tok in ids:
            t0 = time.perf_counter()
            lib.fill(m, bitmask)
            apply_token_bitmask(logits, bitmask)
            per_token.append((time.perf_counter() - t0) * 1e6)
            assert logits[0, tok] == 0, "the valid document's token was masked"
            logits.zero_()
            lib.accept(m, tok)
    return {
        "setup_ms": setup_ms,
        "compile_ms": compile_ms,
        "first_ms": first_ms,
        "mask_us_p50": statistics.median(per_token),
        "tokens": len(ids),
    }


def _engine_cost(model: str, batch: int, tokens: int, runs: int) -> tuple[float, float]:
    """Ms per step of ``batch`` requests of ``tokens`` tokens each (prefill included), free vs
    under a regex of lowercase letters too long to complete in ``tokens`` tokens (so both take
    the same steps), best of ``runs``."""
    from radixray.protocol import GrammarSpec, SamplingParams
    from radixray.worker import Engine, EngineConfig

    engine = Engine(EngineConfig(model=model, device="cpu", seed=0))
    free = SamplingParams(max_tokens=tokens, temperature=1.0, seed=1, ignore_eos=True)
    regex = GrammarSpec("regex", f"[a-z]{{{tokens * 32}}}")
    ruled = free.replace(grammar=regex)
    prompts = [f"request {i}: write" for i in range(batch)]
    out = []
    for params in (free, ruled):
        best = float("inf")
        for _ in range(runs + 1):  # the first run warms up (and compiles the grammar)
            t0 = time.perf_counter()
            res = engine.generate_batch(prompts, params)
            dt = time.perf_counter() - t0
            steps = max(len(r.token_ids) for r in res)
            assert all(len(r.token_ids) == tokens for r in res), "not the same steps"
            best = min(best, dt / steps * 1e3)
        out.append(best)
    engine.shutdown()
    return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 import run, 1 document, tiny only")
    args = ap.parse_args()
    torch.set_num_threads(1)
    models = ["tiny"] if args.quick else ["tiny", "smollm2"]
    metas = {m: load_model_meta(m) for m in models}
    print(
        "| library | install MB | import ms | model | tokenizer set-up ms | compile ms "
        "| matcher + 1st mask ms | mask+apply us/token (p50) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for cls in (_Xgr, _Llg):
        if importlib.util.find_spec(cls.name) is None:
            print(f"| {cls.name} | not installed | | | | | | |")
            continue
        size = _size_mb(cls.name)
        imp = _import_ms(cls.name, 1 if args.quick else 5)
        for model, meta in metas.items():
            r = _measure(cls, meta, 1 if args.quick else 3)
            print(
                f"| {cls.name} | {size:.1f} | {imp:.0f} | {model} | {r['setup_ms']:.1f} | "
                f"{r['compile_ms']:.1f} | {r['first_ms']:.1f} | {r['mask_us_p50']:.1f} |"
            )
    print()
    print("engine (llguidance), batch 8, ms per decode step: free | under a grammar | ratio")
    print("|---|---|---|---|")
    for model in models:
        free, ruled = _engine_cost(model, 8, 8 if args.quick else 32, 1 if args.quick else 3)
        print(f"| {model} | {free:.2f} | {ruled:.2f} | {ruled / free:.2f}x |")


if __name__ == "__main__":
    main()
