"""Structured output: the two grammar libraries side by side (xgrammar, llguidance).

For each library that is installed: its install size (package folders), import time (a fresh
interpreter), the tokenizer set-up and the grammar compile time for a nested JSON schema on the
tiny model's byte vocabulary (320 ids) and on SmolLM2's (49,152), and the per-token mask cost:
the median microseconds to compute the next-token bitmask and apply it to one logits row,
walking a valid document token by token. Then the engine, batch 8, free against under a JSON
schema (an array of at least 64 of the nested schema's objects: it cannot complete in the
tokens asked, so free and ruled run the same steps), once with each library: llguidance is
the engine's own (``radixray.worker.grammar``), xgrammar goes in through the same interface
(``_XgrCompiler``); the helper thread, the sampler's apply and the feedback are the engine's.

The libraries are measured alternated: ``--repeats`` rounds, each measuring every library
afresh (a new import, tokenizer set-up, compile and walk; in the engine a free run and one
under each library), the order reversed every other round (A B, B A, A B, ...; in the engine
rotating over free and the libraries). Every figure is the median over the rounds (the
per-token cost: the median of each round's p50); the tokenizer set-up's first round, which
also pays a library's lazy initialisation in this process, is shown apart.

    .venv/bin/python benchmarks/bench_structured.py            # 5 rounds, 3 documents a round
    .venv/bin/python benchmarks/bench_structured.py --quick    # 2 rounds, tiny model only

xgrammar is not a dependency: ``pip install xgrammar==0.2.9`` first to compare (else its rows
say "not installed").
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


# The engine's grammar: the nested schema's objects, at least 64 of them, so no request can
# complete it in the tokens asked (free and ruled runs take the same steps); compact JSON, as
# the engine's llguidance grammars are (``whitespace_flexible: False``).
ENGINE_SCHEMA = json.dumps({"type": "array", "items": SCHEMA, "minItems": 64})


class _XgrMatcher:
    """An xgrammar matcher behind the engine's matcher interface (``grammar.GrammarMatcher``)."""

    def __init__(self, matcher):
        self._m = matcher

    def fill(self, row: torch.Tensor) -> None:
        self._m.fill_next_token_bitmask(row.unsqueeze(0), 0)

    def accept(self, token: int) -> bool:
        return self._m.accept_token(token)

    @property
    def done(self) -> bool:  # xgrammar: only once a stop token was accepted
        return self._m.is_terminated()

    @property
    def accepting(self) -> bool:
        return self._m.is_completed()

    @property
    def error(self) -> str | None:
        return None


class _XgrCompiler:
    """xgrammar behind the engine's compiler interface (``grammar.GrammarCompiler``: matcher,
    new_bitmask), JSON schemas only, compact as the engine's llguidance ones."""

    def __init__(self, tokenizer, model_vocab_size: int):
        vocab = vocab_of(tokenizer, model_vocab_size)
        self.vocab_size = len(vocab.tokens)
        self._lib = _Xgr(vocab, self.vocab_size)
        self._compiled: dict[str, object] = {}

    def matcher(self, kind: str, spec: str) -> _XgrMatcher:
        assert kind == "json_schema", f"the xgrammar adapter compiles JSON schemas, not {kind}"
        if spec not in self._compiled:
            self._compiled[spec] = self._lib.compiler.compile_json_schema(
                spec, any_whitespace=False, separators=(",", ":")
            )
        return _XgrMatcher(self._lib.matcher(self._compiled[spec]))

    def new_bitmask(self, rows: int) -> torch.Tensor:
        return torch.full((rows, (self.vocab_size + 31) // 32), -1, dtype=torch.int32)


def _use(engine, compiler) -> None:
    """Gives the engine's structured output ``compiler`` from now on. StructuredOutput makes its
    compiler on first use and has no public hook; this benchmark sets it (and the helper thread
    it would make) in its place."""
    from concurrent.futures import ThreadPoolExecutor

    so = engine.structured
    so._compiler = compiler
    if so._pool is None:
        so._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")


def _ms_per_step(engine, prompts: list[str], params, tokens: int) -> float:
    """Ms per step of one batch run whole (prefill included), every request ``tokens`` long."""
    t0 = time.perf_counter()
    res = engine.generate_batch(prompts, params)
    dt = time.perf_counter() - t0
    assert all(len(r.token_ids) == tokens for r in res), "not the same steps"
    return dt / tokens * 1e3


def _engine_rounds(model: str, libs: list, batch: int, tokens: int, rounds: int) -> dict:
    """Ms per step of ``batch`` requests of ``tokens`` tokens, free and under ENGINE_SCHEMA with
    each library in ``libs``: {variant: [one per round]}, the order rotating every round."""
    from radixray.protocol import GrammarSpec, SamplingParams
    from radixray.worker import Engine, EngineConfig
    from radixray.worker.grammar import GrammarCompiler

    engine = Engine(EngineConfig(model=model, device="cpu", seed=0))
    makers = {"xgrammar": _XgrCompiler, "llguidance": GrammarCompiler}
    vocab = engine.model_config.vocab_size
    compilers = {c.name: makers[c.name](engine.tokenizer, vocab) for c in libs}
    free = SamplingParams(max_tokens=tokens, temperature=1.0, seed=1, ignore_eos=True)
    ruled = free.replace(grammar=GrammarSpec("json_schema", ENGINE_SCHEMA))
    prompts = [f"request {i}: write" for i in range(batch)]
    variants = ["free", *compilers]
    got: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(-1, rounds):  # round -1 warms up (and compiles the grammars)
        for k in range(len(variants)):
            v = variants[(r + k) % len(variants)]
            if v != "free":
                _use(engine, compilers[v])
            ms = _ms_per_step(engine, prompts, free if v == "free" else ruled, tokens)
            if r >= 0:
                got[v].append(ms)
    engine.shutdown()
    return got


def _library_rounds(libs: list, metas: dict, rounds: int, docs: int) -> dict:
    """{(library, model): [one _measure dict per round]} and {library: [import ms per round]},
    the libraries alternated: A B, then B A, every round measuring each afresh."""
    measured: dict[tuple[str, str], list[dict]] = {}
    imports: dict[str, list[float]] = {c.name: [] for c in libs}
    for r in range(rounds):
        for cls in libs if r % 2 == 0 else libs[::-1]:
            imports[cls.name].append(_import_ms(cls.name, 1))
            for model, meta in metas.items():
                measured.setdefault((cls.name, model), []).append(_measure(cls, meta, docs))
    return {"measured": measured, "imports": imports}


def _print_libraries(libs: list, metas: dict, got: dict) -> None:
    med = statistics.median
    print(
        "| library | install MB | import ms | model | tokenizer set-up ms (1st round) "
        "| compile ms | matcher + 1st mask ms | mask+apply us/token (p50) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for cls in (_Xgr, _Llg):
        if cls not in libs:
            print(f"| {cls.name} | not installed | | | | | | |")
            continue
        size, imp = _size_mb(cls.name), med(got["imports"][cls.name])
        for model in metas:
            rs = got["measured"][(cls.name, model)]
            print(
                f"| {cls.name} | {size:.1f} | {imp:.0f} | {model} | "
                f"{med(r['setup_ms'] for r in rs):.1f} ({rs[0]['setup_ms']:.1f}) | "
                f"{med(r['compile_ms'] for r in rs):.1f} | {med(r['first_ms'] for r in rs):.1f} | "
                f"{med(r['mask_us_p50'] for r in rs):.1f} |"
            )
    for (name, model), rs in got["measured"].items():
        p50s = ", ".join(f"{r['mask_us_p50']:.1f}" for r in rs)
        print(f"  {name} {model}: mask+apply p50 per round (us): {p50s}")


def _print_engine(model: str, got: dict) -> None:
    med = statistics.median
    free = got["free"]
    for name in (n for n in got if n != "free"):
        ratio = med(t / f for t, f in zip(got[name], free, strict=True))
        print(f"| {model} | {name} | {med(free):.2f} | {med(got[name]):.2f} | {ratio:.2f}x |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 rounds, 1 document, tiny only")
    ap.add_argument("--repeats", type=int, default=5, help="rounds, the libraries alternated")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--engine-tokens", type=int, default=32)
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.engine_tokens = 2, 8
    torch.set_num_threads(1)
    models = ["tiny"] if args.quick else ["tiny", "smollm2"]
    metas = {m: load_model_meta(m) for m in models}
    libs = [c for c in (_Xgr, _Llg) if importlib.util.find_spec(c.name) is not None]
    got = _library_rounds(libs, metas, args.repeats, 1 if args.quick else 3)
    print(f"{args.repeats} rounds, the libraries alternated (A B, B A, ...); medians")
    _print_libraries(libs, metas, got)
    print()
    print(
        f"engine, batch {args.batch}, {args.engine_tokens} tokens, under the JSON schema with "
        f"each library, ms per step (medians of {args.repeats} rounds, order rotating; ratio: "
        "median of each round's ruled / free)"
    )
    print("| model | library | free | under the JSON schema | ratio |")
    print("|---|---|---|---|---|")
    for model in models:
        rounds = _engine_rounds(model, libs, args.batch, args.engine_tokens, args.repeats)
        _print_engine(model, rounds)


if __name__ == "__main__":
    main()
