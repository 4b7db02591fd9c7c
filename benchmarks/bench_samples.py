"""``n`` samples of one prompt: one request with ``n`` against SGLang's fan-out, emulated.

On the engine (no HTTP), on a cold cache (a fresh random prompt each run), with the prompt of
``--prompt-len`` tokens:

* ``n=1``: one request; its TTFT is the bound (16-token pages, radixray's default).
* ``n=N``: one request with ``n=N`` (radixray: one prefill, the forks' first tokens in its step).
* ``n=1, page 1``: ``n=1`` on an engine with 1-token pages: the bound of the emulation below.
* ``N requests, SGLang fan-out (emulated, page 1)``: what SGLang's tokenizer manager does with
  ``n > 1``: a prefill of the prompt alone (SGLang sends it with ``max_new_tokens=0``; here one
  token, the same forward), awaited, then N requests of one sample each, sent together. SGLang's
  default page size is 1, so every prompt token but the last is reusable: the emulation runs
  on an engine with 1-token pages, where each copy matches all but the last prompt token and
  computes that one (N + the prompt in all). It is radixray's engine doing SGLang's steps, not
  SGLang: the steps' cost is ours.
* ``N requests, no sharing`` (only with ``--unshared``): N copies on an engine with in-flight
  sharing off and a step budget of N x the prompt, all computing the whole prompt in one step.
  No current engine does this (vLLM V1 shares prefix blocks within a batch, SGLang fans out as
  above): a reference row, never the peer.

The variants take turns within each run (the order rotating), so a machine whose speed drifts
weighs on all of them alike. Reported per variant, medians over ``--runs``: the time until all
N samples have their first token (with ``max_tokens=1``) and its ratio to n=1's TTFT at the
same page size, the prompt tokens the engine computed, and the output tokens/s of a whole
request with ``--decode-tokens`` per sample (its prefill, and the fan-out's prefix request,
included).

    .venv/bin/python benchmarks/bench_samples.py                # SmolLM2, 1,024 tokens, n = 8
    .venv/bin/python benchmarks/bench_samples.py --quick        # tiny model, 64 tokens, n = 4
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import time

from radixray.protocol import RequestError, SamplingParams
from radixray.worker import Engine, EngineConfig

_IDS = itertools.count()

N1, NN, N1_PAGE1, FANOUT, UNSHARED = (
    "n=1",
    "n=N",
    "n=1, page 1",
    "N requests, SGLang fan-out (emulated, page 1)",
    "N requests, no sharing (no current engine does this)",
)
# variant -> (engine, the variant whose TTFT bounds it)
ENGINE = {N1: "page16", NN: "page16", N1_PAGE1: "page1", FANOUT: "page1", UNSHARED: "unshared"}
BOUND = {N1: N1, NN: N1, N1_PAGE1: N1_PAGE1, FANOUT: N1_PAGE1, UNSHARED: N1}


def _label(variant: str, n: int) -> str:
    return variant.replace("n=N", f"n={n}").replace("N requests", f"{n} requests")


def _prompt(rng: random.Random, vocab: int, length: int) -> list[int]:
    return [rng.randrange(10, vocab) for _ in range(length)]


def _first_token_all(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> float:
    """Submit the requests together and step: seconds until every sample of every request has
    its first token (then run them to their ends)."""
    got: set[tuple[str, int]] = set()
    start = time.perf_counter()
    for p in prompts:
        req = engine.requests.build(p, params, f"r{next(_IDS)}")

        def sink(c, rid=req.request_id):
            if not isinstance(c, RequestError) and c.token_ids:
                got.add((rid, c.index))

        engine.add(req, sink)
    want = len(prompts) * params.n
    while len(got) < want:
        engine.step()
    took = time.perf_counter() - start
    while engine.has_work():
        engine.step()
    return took


def _first_tokens(eng: Engine, variant: str, prompt: list[int], n: int) -> float:
    """Seconds until all samples of ``variant`` on ``prompt`` have their first token."""
    one = SamplingParams(max_tokens=1, temperature=1.0, seed=1)
    if variant in (N1, N1_PAGE1):
        return _first_token_all(eng, [prompt], one)
    if variant == NN:
        return _first_token_all(eng, [prompt], one.replace(n=n))
    t0 = time.perf_counter()
    if variant == FANOUT:  # SGLang's prefix request, awaited before the copies are sent
        eng.generate_batch([prompt], one)
    prefix_s = time.perf_counter() - t0
    return prefix_s + _first_token_all(eng, [prompt] * n, one)


def _tokens_per_s(eng: Engine, variant: str, prompt: list[int], n: int, tokens: int) -> float:
    """Output tokens/s of the whole of ``variant`` with ``tokens`` per sample."""
    dec = SamplingParams(max_tokens=tokens, temperature=1.0, seed=1, ignore_eos=True)
    t0 = time.perf_counter()
    if variant in (N1, N1_PAGE1):
        outs = eng.generate_batch([prompt], dec)
    elif variant == NN:
        outs = eng.generate_batch([prompt], dec.replace(n=n))
    else:
        if variant == FANOUT:
            eng.generate_batch([prompt], dec.replace(max_tokens=1))  # not counted as output
        outs = eng.generate_batch([prompt] * n, dec)
    return sum(c.completion_tokens for c in outs) / (time.perf_counter() - t0)


def _one_run(args, engines: dict[str, Engine], variant: str, rng: random.Random) -> tuple:
    """One cold run of ``variant``: (seconds to all first tokens, prompt tokens computed,
    output tokens/s of a second request run whole with ``--decode-tokens`` per sample)."""
    eng = engines[ENGINE[variant]]
    vocab = eng.model_config.vocab_size
    before = eng.meter.prefill_tokens
    first = _first_tokens(eng, variant, _prompt(rng, vocab, args.prompt_len), args.n)
    computed = eng.meter.prefill_tokens - before
    prompt = _prompt(rng, vocab, args.prompt_len)
    return first, computed, _tokens_per_s(eng, variant, prompt, args.n, args.decode_tokens)


def _engines(args) -> dict[str, Engine]:
    def make(page_size: int, dedupe: bool, budget: int) -> Engine:
        cfg = EngineConfig(
            model=args.model,
            device="cpu",
            page_size=page_size,
            max_batch_tokens=max(1024, budget),
            dedupe_in_flight=dedupe,
            seed=0,
        )
        return Engine(cfg)

    out = {"page16": make(16, True, args.prompt_len), "page1": make(1, True, args.prompt_len)}
    if args.unshared:
        out["unshared"] = make(16, False, args.prompt_len * args.n)
    return out


def _print_table(args, rows: dict[str, dict]) -> None:
    print()
    print(
        "| variant | all first tokens (s) | / n=1 TTFT (same page size) | prompt tokens computed "
        "| tokens/s |"
    )
    print("|---|---|---|---|---|")
    for variant, r in rows.items():
        base = rows[BOUND[variant]]["first_all_s"]
        print(
            f"| {_label(variant, args.n)} | {r['first_all_s']:.3f} | "
            f"{r['first_all_s'] / base:.2f}x | {r['prefill_tokens']:.0f} | "
            f"{r['tokens_per_s']:.1f} |"
        )
    mine, peer = rows[NN], rows[FANOUT]
    print(
        f"\nheadline: n={args.n} has all first tokens at "
        f"{mine['first_all_s'] / rows[N1]['first_all_s']:.2f}x n=1's TTFT; SGLang's fan-out, "
        f"emulated on this engine at SGLang's default page size 1, at "
        f"{peer['first_all_s'] / rows[N1_PAGE1]['first_all_s']:.2f}x (computing "
        f"{peer['prefill_tokens']:.0f} prompt tokens against {mine['prefill_tokens']:.0f}); "
        f"output {mine['tokens_per_s'] / peer['tokens_per_s']:.2f}x the emulation's tokens/s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument(
        "--unshared", action="store_true", help="add the no-sharing reference row (no peer)"
    )
    ap.add_argument("--quick", action="store_true", help="tiny model, 64 tokens, n=4, 2 runs")
    args = ap.parse_args()
    if args.quick:
        args.model, args.prompt_len, args.n, args.runs, args.decode_tokens = "tiny", 64, 4, 2, 4
    engines = _engines(args)
    rng = random.Random(0)
    for eng in engines.values():  # warm up: first-call costs out of the numbers
        eng.generate_batch([_prompt(rng, eng.model_config.vocab_size, args.prompt_len)])
    print(
        f"model {args.model}, prompt {args.prompt_len} tokens, N = {args.n}, "
        f"{args.runs} runs, cold cache; medians. The fan-out row is an emulation: radixray's "
        "engine taking SGLang's steps at SGLang's default page size (1)",
        flush=True,
    )
    variants = [v for v in ENGINE if ENGINE[v] in engines]
    got: dict[str, list[tuple]] = {v: [] for v in variants}
    for run in range(args.runs):
        for k in range(len(variants)):
            variant = variants[(run + k) % len(variants)]
            got[variant].append(_one_run(args, engines, variant, rng))
        print(f"  run {run + 1}/{args.runs} done", flush=True)
    rows = {
        v: {
            "first_all_s": statistics.median(r[0] for r in runs),
            "prefill_tokens": statistics.median(r[1] for r in runs),
            "tokens_per_s": statistics.median(r[2] for r in runs),
        }
        for v, runs in got.items()
    }
    _print_table(args, rows)
    for eng in engines.values():
        eng.shutdown()


if __name__ == "__main__":
    main()
