"""``n`` samples of one prompt: one request with ``n`` against ``n`` separate requests.

On the engine (no HTTP), on a cold cache (a fresh random prompt each run), with the prompt of
``--prompt-len`` tokens:

* ``n=1``: one request; its TTFT is the bound.
* ``n=N``: one request with ``n=N`` (radixray: one prefill, the forks' first tokens in its step).
* ``N requests, dedupe``: N requests sent together, the way a client without ``n`` (or a peer
  that fans ``n`` out, as SGLang does) gets them: the engine defers the copies while the first
  computes the shared pages, then they match them and compute their partial page.
* ``N requests, at once``: the same with in-flight deduplication off and a step budget that
  admits all N together (N x the prompt): every copy computes the whole prompt in the same
  step, as an engine without in-flight sharing does with the budget to batch them.

The variants take turns within each run (the order rotating), so a machine whose speed drifts
weighs on all of them alike. Reported per variant, medians over ``--runs``: the time until all
N samples have their first token (with ``max_tokens=1``) and its ratio to n=1's TTFT, the
prompt tokens the engine computed, and the output tokens/s of a whole request with
``--decode-tokens`` per sample (its prefill included).

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


VARIANTS = ("n=1", "n=N", "N requests, dedupe", "N requests, at once")


def _one_run(args, engines: dict[bool, Engine], variant: str, rng: random.Random) -> tuple:
    """One cold run of ``variant``: (seconds to all first tokens, prompt tokens computed,
    output tokens/s of a second request run whole with ``--decode-tokens`` per sample)."""
    eng = engines[variant != "N requests, at once"]
    vocab, n = eng.model_config.vocab_size, args.n
    one = SamplingParams(max_tokens=1, temperature=1.0, seed=1)
    if variant == "n=1":
        copies, params = 1, one
    elif variant == "n=N":
        copies, params = 1, one.replace(n=n)
    else:
        copies, params = n, one
    before = eng.meter.prefill_tokens
    first = _first_token_all(eng, [_prompt(rng, vocab, args.prompt_len)] * copies, params)
    computed = eng.meter.prefill_tokens - before
    dec = params.replace(max_tokens=args.decode_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    outs = eng.generate_batch([_prompt(rng, vocab, args.prompt_len)] * copies, dec)
    return first, computed, sum(c.completion_tokens for c in outs) / (time.perf_counter() - t0)


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
                max_batch_tokens=max(1024, args.prompt_len * (1 if dedupe else args.n)),
                dedupe_in_flight=dedupe,
                seed=0,
            )
        )
        for dedupe in (True, False)
    }
    rng = random.Random(0)
    for eng in engines.values():  # warm up: first-call costs out of the numbers
        eng.generate_batch([_prompt(rng, eng.model_config.vocab_size, args.prompt_len)])
    print(
        f"model {args.model}, prompt {args.prompt_len} tokens, N = {args.n}, "
        f"{args.runs} runs, cold cache; medians",
        flush=True,
    )
    got: dict[str, list[tuple]] = {v: [] for v in VARIANTS}
    for run in range(args.runs):
        for k in range(len(VARIANTS)):
            variant = VARIANTS[(run + k) % len(VARIANTS)]
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
