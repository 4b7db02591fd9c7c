"""The engine's host time per decode step, the forward timed apart (issue 43's CPU side).

On a GPU, what the host does around the forward (schedule the step, build its inputs, sample,
detokenize and emit per request) is time the device waits unless it is overlapped; on the CPU
it is measured here, every session, on the tiny model (whose forward is cheap, so the host's
share shows). The engine decodes ``batch`` requests (32-token prompts, greedy, EOS ignored); each
decode-only step is split by wrapping the engine's own calls:

- ``schedule``: ``Scheduler.schedule``
- ``inputs``: ``ModelRunner.run`` less the model's forward (page tables, positions, token ids)
- ``forward``: the model's forward (the device's work; on a CPU, the CPU's)
- ``sample``: ``Sampler.sample``
- ``emit``: the rest of ``Engine._emit`` (detokenize, finish checks, chunks)
- ``other``: the rest of ``Engine.step`` (postprocess, metering)

``host`` is the step less its forward. Medians over the decode steps, in ms. ``--clock thread``
times each part in the calling thread's CPU time instead of wall time: on a machine shared with
other work the time this process waits for a core is then left out (the forward on one thread).

    .venv/bin/python benchmarks/bench_host_step.py             # batch 1, 8, 64; 64 tokens each
    .venv/bin/python benchmarks/bench_host_step.py --quick     # batch 1 and 8, 16 tokens
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch

PARTS = ("schedule", "inputs", "forward", "sample", "emit", "other")


CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}
clock = time.perf_counter  # (``--clock``)


def _timed(spent: dict, key: str, fn):
    def wrapper(*a, **kw):
        t0 = clock()
        try:
            return fn(*a, **kw)
        finally:
            spent[key] += clock() - t0

    return wrapper


class _TimedModel:
    """The runner's model, its calls timed (``runner.run`` calls ``self.model(...)``)."""

    def __init__(self, model, spent: dict):
        self._model, self._spent = model, spent

    def __call__(self, *a, **kw):
        t0 = clock()
        out = self._model(*a, **kw)
        self._spent["model"] += clock() - t0
        return out

    def __getattr__(self, name):
        return getattr(self._model, name)


def measure(batch: int, tokens: int, threads: int, temperature: float = 0.0) -> dict:
    from radixray.worker import Engine, EngineConfig, SamplingParams

    torch.set_num_threads(threads)
    pages = batch * (-(-(32 + tokens) // 16) + 1) + 16
    engine = Engine(
        EngineConfig(
            model="tiny", num_pages=pages, max_running=batch, cpu_threads=threads, overlap="off"
        )
    )
    spent: dict = defaultdict(float)
    engine.scheduler.schedule = _timed(spent, "schedule", engine.scheduler.schedule)
    engine.runner.run = _timed(spent, "run", engine.runner.run)
    engine.runner.model = _TimedModel(engine.runner.model, spent)
    engine.sampler.sample = _timed(spent, "sample", engine.sampler.sample)
    engine._emit = _timed(spent, "emit_all", engine._emit)
    params = SamplingParams(
        max_tokens=tokens, temperature=temperature, top_p=0.95, seed=1, ignore_eos=True
    )
    for i in range(batch):
        engine.add_request([(7 * i + j) % 250 + 1 for j in range(32)], params)
    rows: dict[str, list[float]] = defaultdict(list)
    while engine.has_work():
        spent.clear()
        t0 = clock()
        engine.step()
        total = clock() - t0
        if spent["model"] == 0 or engine.scheduler.waiting:
            continue
        running = engine.scheduler.running
        if len(running) != batch or any(not r.output_ids for r in running):
            continue  # not a decode-only step of the whole batch
        parts = {
            "schedule": spent["schedule"],
            "inputs": spent["run"] - spent["model"],
            "forward": spent["model"],
            "sample": spent["sample"],
            "emit": spent["emit_all"] - spent["sample"],
        }
        parts["other"] = total - sum(parts.values())
        parts["step"], parts["host"] = total, total - spent["model"]
        for k, v in parts.items():
            rows[k].append(1000 * v)
    return {k: statistics.median(v) for k, v in rows.items()} | {"steps": len(rows["step"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="thread: CPU time")
    ap.add_argument("--quick", action="store_true", help="batch 1 and 8, 16 tokens")
    args = ap.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    if args.quick:
        args.batches, args.tokens = [1, 8], 16
    cols = ("step", "host", *PARTS)
    how = "greedy" if args.temperature == 0 else f"temperature {args.temperature}, top_p 0.95"
    print(f"tiny model, {args.threads} threads, {args.tokens} tokens a request ({how}); ms/step")
    print("| batch | steps | " + " | ".join(cols) + " | host share |")
    print("|---" * (len(cols) + 3) + "|")
    for b in args.batches:
        r = measure(b, args.tokens, args.threads, args.temperature)
        cells = " | ".join(f"{r[c]:.3f}" for c in cols)
        print(f"| {b} | {r['steps']} | {cells} | {r['host'] / r['step']:.0%} |", flush=True)


if __name__ == "__main__":
    main()
