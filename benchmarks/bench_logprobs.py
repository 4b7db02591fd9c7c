"""What logprobs cost: decode tokens/s and prefill time through the Engine, with and without them.

    python benchmarks/bench_logprobs.py               # SmolLM2-135M-Instruct, 5 repeats
    python benchmarks/bench_logprobs.py --quick       # the tiny model, 1 repeat: a smoke test

Measured, on one engine per measurement (a cold cache, so nothing is answered from pages):

- **decode tokens/s** of --batch distinct prompts of --prompt-len tokens, greedy, --max-tokens
  new tokens, EOS ignored, with logprobs off, ``logprobs=0`` (the sampled token's only) and
  ``logprobs`` 5 and 20 (OpenAI's top_logprobs). The window starts once every request has its
  first token and ends with the last (as bench_engine.py times decode); the four engines are
  stepped in turn.
- **prefill ms of a --echo-len-token prompt** (``max_tokens=1``) with prompt logprobs off and
  with ``prompt_logprobs`` 0, 1 and 5: what ``echo`` + ``logprobs`` on /v1/completions (how
  lm-evaluation-harness scores multiple choice) adds to a prefill.

The configurations run round-robin within each repeat (a slow phase of a shared machine hits
them all alike); the table has the medians over --repeats and each one's cost against "off".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from radixray.sim.data import data_text  # noqa: E402
from radixray.sysinfo import cpu_model  # noqa: E402
from radixray.worker import Engine, EngineConfig, SamplingParams  # noqa: E402
from radixray.worker.model_runner import load_for_engine  # noqa: E402

DECODE = {"off": None, "logprobs=0": 0, "top_logprobs=5": 5, "top_logprobs=20": 20}
ECHO = {"off": None, "prompt_logprobs=0": 0, "prompt_logprobs=1": 1, "prompt_logprobs=5": 5}


class Bench:
    def __init__(self, model: str, threads: int, num_pages: int):
        torch.set_num_threads(threads)
        self.config = EngineConfig(model=model, num_pages=num_pages, cpu_threads=threads, seed=0)
        self.loaded = load_for_engine(self.config, torch.device("cpu"))
        if model == "tiny":  # a byte model: any ids below the vocabulary
            vocab = self.loaded[1].vocab_size
            g = torch.Generator().manual_seed(0)
            self.corpus = torch.randint(3, vocab, (4096,), generator=g).tolist()
        else:
            text = data_text("text_prompts/sonnet_llmperf.txt")
            self.corpus = self.loaded[2].encode(text)

    def prompts(self, n: int, length: int) -> list[list[int]]:
        """n distinct windows of the corpus (nothing shared between them)."""
        ids, step = self.corpus, max(1, length // 2 + 7)
        ids = ids * ((n * step + length) // len(ids) + 1)
        return [ids[i * step : i * step + length] for i in range(n)]

    def engine(self) -> Engine:
        return Engine(replace(self.config), loaded=self.loaded)

    def decode(self, prompts: list[list[int]], max_tokens: int) -> dict[str, float]:
        """Decode tokens/s of every DECODE configuration, one engine each, stepped in turn (a
        slow moment of a shared machine hits them alike)."""
        engines, started, tokens, seconds = {}, {}, {}, {}
        for name, k in DECODE.items():
            engines[name] = self.engine()
            params = SamplingParams(
                max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=k
            )
            for p in prompts:
                engines[name].add_request(p, params)
            started[name], tokens[name], seconds[name] = 0, 0, 0.0
        while any(e.has_work() for e in engines.values()):
            for name, engine in engines.items():
                if not engine.has_work():
                    continue
                t0 = time.perf_counter()
                chunks = engine.step()
                dt = time.perf_counter() - t0
                if started[name] == len(prompts):  # every request had its first token
                    tokens[name] += sum(len(c.token_ids) for c in chunks)
                    seconds[name] += dt
                    if DECODE[name] is not None:  # the logprobs really came back
                        assert all(len(c.logprobs) == len(c.token_ids) for c in chunks)
                started[name] = max(started[name], len(chunks))
        return {name: tokens[name] / seconds[name] for name in DECODE}

    def prefill_ms(self, prompt: list[int], k: int | None) -> float:
        engine = self.engine()
        params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, prompt_logprobs=k)
        t0 = time.perf_counter()
        (out,) = engine.generate_batch([prompt], params)
        ms = 1000 * (time.perf_counter() - t0)
        assert out.prompt_tokens == len(prompt) and out.cached_tokens == 0
        return ms


def _table(title: str, unit: str, medians: dict[str, float], higher_is_better: bool) -> str:
    base = medians["off"]
    lines = [f"| {title} | {unit} | time vs off |", "|---|---:|---:|"]
    for name, v in medians.items():
        cost = (base / v - 1) if higher_is_better else (v / base - 1)
        lines.append(f"| {name} | {v:.1f} | {'-' if name == 'off' else f'{cost:+.1%}'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the tiny model, small sizes, 1 repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--echo-len", type=int, default=512)
    ap.add_argument("--json", help="write every measurement here")
    args = ap.parse_args(argv)
    model = "smollm2"
    if args.quick:
        model, args.repeats, args.batch, args.max_tokens = "tiny", 1, 4, 8
    bench = Bench(model, args.threads, num_pages=256)
    prompts = bench.prompts(args.batch, args.prompt_len)
    (echo,) = bench.prompts(1, args.echo_len)
    runs: dict[str, dict[str, list[float]]] = {"decode": {}, "prefill": {}}
    bench.decode(prompts[:1], 4)  # warm-up: first-call allocations, kernels
    for r in range(args.repeats):
        for name, v in bench.decode(prompts, args.max_tokens).items():
            runs["decode"].setdefault(name, []).append(v)
        for name, k in ECHO.items():
            runs["prefill"].setdefault(name, []).append(bench.prefill_ms(echo, k))
        print(f"repeat {r + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    med = {kind: {n: statistics.median(v) for n, v in d.items()} for kind, d in runs.items()}
    machine = f"{cpu_model()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    print(f"{model}, {machine}, torch threads {args.threads}, medians of {args.repeats}")
    print(
        _table(
            f"decode, batch {args.batch}, prompt {args.prompt_len}, {args.max_tokens} new",
            "tokens/s",
            med["decode"],
            higher_is_better=True,
        )
    )
    print()
    print(_table(f"prefill of {args.echo_len} tokens", "ms", med["prefill"], False))
    result = {"model": model, "machine": machine, "args": vars(args), "runs": runs, "medians": med}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
