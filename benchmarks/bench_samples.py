"""``n`` samples of one prompt: one request with ``n`` against ``n`` separate requests.

On the engine (no HTTP), on a cold cache (a fresh random prompt each run), with the prompt of
``--prompt-len`` tokens:

* ``n=1``: one request; its TTFT is the bound.
* ``n=N``: one request with ``n=N`` (radixray: one prefill, the forks' first tokens in its step).
* ``N requests, dedupe``: N requests sent together, the way a client without ``n`` (or a peer
  that fans ``n`` out, as SGLang does) gets them: the engine defers the copies while the first
  computes the shared pages, then they match them and compute their partial page.
* ``N requests, no dedupe``: the same with in-flight deduplication off: every copy computes
  the whole prompt in the same batch (vLLM v1's fan-out of ``n`` on a cold cache).

Reported per variant, medians over ``--runs``: the time until all N samples have their first
token (with ``max_tokens=1``) and its ratio to n=1's TTFT, the prompt tokens the engine
computed, and the decode throughput (output tokens/s over the whole request with
``--decode-tokens`` per sample).

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


VARIANTS = ("n=1", "n=N", "N requests, dedupe", "N requests, no dedupe")


def _measure(args, engines: dict[bool, Engine], variant: str, rng: random.Random) -> dict:
    eng = engines[variant != "N requests, no dedupe"]
    vocab = eng.model_config.vocab_size
    ttfts, prefill, tps = [], [], []
    n = args.n
    for _ in range(args.runs):
        prompt = _prompt(rng, vocab, args.prompt_len)
        one = SamplingParams(max_tokens=1, temperature=1.0, seed=1)
        if variant == "n=1":
            prompts, params = [prompt], one
        elif variant == "n=N":
            prompts, params = [prompt], one.replace(n=n)
        else:
            prompts, params = [prompt] * n, one
        before = eng.meter.prefill_tokens
        ttfts.append(_first_token_all(eng, prompts, params))
        prefill.append(eng.meter.prefill_tokens - before)
        # decode: a fresh prompt, every sample to decode-tokens
        fresh = [_prompt(rng, vocab, args.prompt_len)] * len(prompts)
        dec = params.replace(max_tokens=args.decode_tokens, ignore_eos=True)
        t0 = time.perf_counter()
        outs = eng.generate_batch(fresh, dec)
        dt = time.perf_counter() - t0
        tps.append(sum(c.completion_tokens for c in outs) / dt)
    return {
        "first_all_s": statistics.median(ttfts),
        "prefill_tokens": statistics.median(prefill),
        "tokens_per_s": statistics.median(tps),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="tiny model, 64 tokens, n=4, 2 runs")
    args = ap.parse_args()
    if args.quick:
        args.model, args.prompt_len, args.n, args.runs, args.decode_tokens = "tiny", 64, 4, 2, 4
    engines = {
        dedupe: Engine(
            EngineConfig(
                model=args.model,
                device="cpu",
                max_batch_tokens=max(1024, args.prompt_len),
                dedupe_in_flight=dedupe,
                seed=0,
            )
        )
        for dedupe in (True, False)
    }
    rng = random.Random(0)
    for eng in engines.values():  # warm up: first-call costs out of the numbers
        eng.generate_batch([_prompt(rng, eng.model_config.vocab_size, 32)], SamplingParams(4))
    print(
        f"model {args.model}, prompt {args.prompt_len} tokens, N = {args.n}, "
        f"{args.runs} runs, cold cache; medians",
        flush=True,
    )
    rows = {}
    for variant in VARIANTS:
        rows[variant] = _measure(args, engines, variant, rng)
        print(f"  {variant}: {rows[variant]}", flush=True)
    base = rows["n=1"]["first_all_s"]
    print()
    print("| variant | all first tokens (s) | / n=1 TTFT | prompt tokens computed | tokens/s |")
    print("|---|---|---|---|---|")
    for variant, r in rows.items():
        print(
            f"| {variant.replace('N', str(args.n))} | {r['first_all_s']:.3f} | "
            f"{r['first_all_s'] / base:.2f}x | {r['prefill_tokens']:.0f} | "
            f"{r['tokens_per_s']:.1f} |"
        )
    for eng in engines.values():
        eng.shutdown()


if __name__ == "__main__":
    main()
