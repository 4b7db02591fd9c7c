"""Worker engine benchmark: radixray vs HF transformers on SmolLM2-135M-Instruct, float32, CPU.

    python benchmarks/bench_engine.py                 # 3 runs, threads 1, ~8 min on 2 busy cores
    python benchmarks/bench_engine.py --runs 5 --threads 2 --plot benchmarks/bench_engine.png
    python benchmarks/bench_engine.py --quick         # 1 run, tiny sizes: a smoke test

Both sides load the same GGUF and run with the same torch threads, each in a child process. HF
runs ``generate`` with its default cache (DynamicCache) and with a static one
(``cache_implementation="static"``; eager: transformers compiles it only on accelerators). The
order of radixray, HF default and HF static rotates every run (each leads in turn), so a shared
machine's slow phases hit all alike. The peer quoted is the better HF variant (per batch the
higher median tokens/s; for the TTFT the lower median), named beside its figure. Medians over
--runs, after a warm-up call per side; every run's JSON goes to --json.

- **decode tokens/s at batch 1, 8, 16**: the same prompts (windows of real text, --prompt-len
  tokens, distinct), greedy, --max-tokens new tokens, EOS ignored; radixray: all submitted at
  once to one engine; transformers: ``generate`` on the batch (equal lengths, no padding). The
  window runs from every request having its first token to the last token (transformers' timed
  by a logits processor, called right after each forward). Speed-up: median per-run ratio.
- **TTFT of a 2,048-token prompt**: cold (fresh engine) vs its first 90% cached (page-aligned:
  1,840 of 2,048 tokens); wall time of ``generate_batch([prompt], max_tokens=1)``. HF's cold
  prefill (``generate``, one token), both caches, for reference.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import resource
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from radixray.sim.data import data_text  # noqa: E402
from radixray.sysinfo import cpu_model  # noqa: E402

# The HF variants, hf_<generate's cache_implementation>, as the tables name them.
HF_LABEL = {"hf_dynamic": "HF default", "hf_static": "HF static cache"}
PEER_COLUMNS = ["peer (the better HF)", "peer ms/step", "speed-up vs peer", "greedy agreement"]


def _window(tokens: int, seconds: float, steps: int, outputs: list) -> dict:
    ms = 1e3 * seconds / steps
    return {"tokens_per_s": tokens / seconds, "ms_per_step": ms, "outputs": outputs}


def _corpus_text() -> str:
    """Real text for prompts: the sonnets and the MT-bench questions, concatenated."""
    parts = [data_text("text_prompts/sonnet_llmperf.txt")]
    for line in data_text("text_prompts/mt_bench_question.jsonl").splitlines():
        if line.strip():
            parts += json.loads(line).get("turns", [])
    return "\n\n".join(parts)


class RadixSide:
    def __init__(self, threads: int, num_pages: int, cached_fraction: float):
        import torch

        from radixray.worker import Engine, EngineConfig, SamplingParams
        from radixray.worker.model_runner import load_for_engine

        torch.set_num_threads(threads)
        config = EngineConfig(model="smollm2", num_pages=num_pages, cpu_threads=threads)
        self.loaded = load_for_engine(config, torch.device("cpu"))
        self.engine = lambda: Engine(config, loaded=self.loaded)  # a fresh one: a cold cache
        self.greedy = partial(SamplingParams, temperature=0.0, ignore_eos=True)
        self.cached_fraction = cached_fraction

    def corpus_ids(self, n: int) -> list[int]:
        ids = self.loaded[2].encode(_corpus_text())
        return (ids * (n // len(ids) + 1))[:n]

    def decode(self, prompts: list[list[int]], max_tokens: int) -> dict:
        engine, params = self.engine(), self.greedy(max_tokens=max_tokens)
        for p in prompts:
            engine.add_request(p, params)
        # Chunks carry no request id: a step emits one chunk per request that has sampled a
        # token, so once a step emitted one per request, every request has its first token.
        started, window_tokens, window_s, steps = 0, 0, 0.0, 0
        while engine.has_work():
            t0 = time.perf_counter()
            chunks = engine.step()
            dt = time.perf_counter() - t0
            if started == len(prompts):  # every request had its first token before this step
                window_tokens += sum(len(c.token_ids) for c in chunks)
                window_s += dt
                steps += 1
            started = max(started, len(chunks))
        # The outputs, for the agreement check: the same prompts again on this engine (now
        # cached, which changes no output: reuse is exact).
        outputs = [c.token_ids for c in engine.generate_batch(prompts, params)]
        return _window(window_tokens, window_s, steps, outputs)

    def ttft(self, prompt: list[int]) -> dict:
        one = self.greedy(max_tokens=1)
        cold, cold_s = _timed(self.engine(), prompt, one)
        warm = self.engine()
        warm.generate_batch([prompt[: int(len(prompt) * self.cached_fraction)]], one)
        out, cached_s = _timed(warm, prompt, one)
        assert out.token_ids == cold.token_ids, "reuse changed the first token"
        tokens = {"cached_tokens": out.cached_tokens, "prompt_tokens": out.prompt_tokens}
        return {"cold_s": cold_s, "cached_s": cached_s, **tokens}


def _timed(engine, prompt: list[int], params) -> tuple:
    t0 = time.perf_counter()
    return engine.generate_batch([prompt], params)[0], time.perf_counter() - t0


class HFSide:
    """transformers ``generate``, with its default cache (``dynamic``: DynamicCache) or a
    ``static`` one (``cache_implementation="static"``, a StaticCache of fixed length)."""

    def __init__(self, threads: int):
        import torch

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoModelForCausalLM

        from radixray.worker.model.loader import smollm2_gguf_path

        torch.set_num_threads(threads)
        path = smollm2_gguf_path()
        self.model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        ).eval()

    def attn(self) -> str:
        return self.model.config._attn_implementation

    def _generate(self, prompts: list[list[int]], max_tokens: int, cache: str) -> tuple:
        import torch
        from transformers import LogitsProcessor, LogitsProcessorList

        stamps: list[float] = []

        class Stamp(LogitsProcessor):  # called once per forward, just after it
            def __call__(self, input_ids, scores):
                stamps.append(time.perf_counter())
                return scores

        assert f"hf_{cache}" in HF_LABEL, f"no HF variant hf_{cache}: {list(HF_LABEL)}"
        gen = {"max_new_tokens": max_tokens, "do_sample": False, "eos_token_id": None}
        gen.update(pad_token_id=0, logits_processor=LogitsProcessorList([Stamp()]))
        if cache == "static":
            gen["cache_implementation"] = "static"
        ids = torch.tensor(prompts, dtype=torch.int64)
        with torch.inference_mode():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), **gen)
        return stamps, out[:, ids.shape[1] :].tolist()

    def decode(self, prompts: list[list[int]], max_tokens: int, cache: str) -> dict:
        stamps, outputs = self._generate(prompts, max_tokens, cache)
        assert len(stamps) == max_tokens, f"generate stopped after {len(stamps)} tokens"
        steps, window_s = len(stamps) - 1, stamps[-1] - stamps[0]
        return _window(len(prompts) * steps, window_s, steps, outputs)

    def ttft(self, prompt: list[int], cache: str) -> dict:
        t0 = time.perf_counter()
        self._generate([prompt], 1, cache)
        return {"cold_s": time.perf_counter() - t0}


_SIDE = None  # in a child process: the side it serves


def _start(side: str, kwargs: dict) -> None:
    global _SIDE
    _SIDE = RadixSide(**kwargs) if side == "radixray" else HFSide(**kwargs)


def _run(cmd: str, kwargs: dict):
    if cmd == "peak_rss":  # MiB (Linux reports KiB)
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return getattr(_SIDE, cmd)(**kwargs)


class Child:
    """One side in a spawned process of its own; a call's exception is raised here."""

    def __init__(self, side: str, **kwargs):
        ctx = mp.get_context("spawn")
        self.pool = ProcessPoolExecutor(1, ctx, initializer=_start, initargs=(side, kwargs))
        self.loaded_rss_mib = self.call("peak_rss")  # the peak at the end of loading

    def call(self, cmd: str, **kwargs):
        return self.pool.submit(_run, cmd, kwargs).result()

    def close(self) -> None:
        self.pool.shutdown()


def _agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Mean length of the common greedy prefix, as a fraction of the output length."""
    fracs = []
    for x, y in zip(a, b, strict=True):
        n = next((i for i, (u, v) in enumerate(zip(x, y, strict=False)) if u != v), len(x))
        fracs.append(n / max(1, len(x)))
    return statistics.mean(fracs)


def _args(argv: list[str] | None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads, both sides")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 16])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--ttft-len", type=int, default=2048)
    ap.add_argument("--cached-fraction", type=float, default=0.9)
    ap.add_argument("--num-pages", type=int, default=640, help="radixray KV pool, pages of 16")
    ap.add_argument("--no-hf", action="store_true", help="radixray only (profiling)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 1 run, tiny sizes")
    ap.add_argument("--json", default="/tmp/bench_engine.json")
    ap.add_argument("--plot", default=None, help="write a PNG of the comparison here")
    args = ap.parse_args(argv)
    if args.quick:
        args.runs, args.batches, args.prompt_len = 1, [1, 2], 32
        args.ttft_len, args.max_tokens = 128, 4
    return args


def _measure(args, radix: Child, hf: Child | None, prompts: dict, long_prompt: list[int]):
    """Every run: decode at each batch, then the TTFT, the sides' order rotated by one a run.
    Sides: radixray, and hf_<cache> (the transformers child with that cache)."""
    from tqdm import tqdm

    sides = ["radixray", *(HF_LABEL if hf else [])]

    def call(side: str, cmd: str, **kw):
        if side == "radixray":
            return radix.call(cmd, **kw)
        return hf.call(cmd, cache=side.removeprefix("hf_"), **kw)

    for side in sides:  # warm up: first-call costs out of the runs
        call(side, "decode", prompts=prompts[args.batches[0]], max_tokens=2)
    runs: list[dict] = []
    loads: list[float] = []
    with tqdm(total=args.runs * (len(args.batches) + 1), desc="bench_engine", unit="case") as bar:
        for run in range(args.runs):
            order = sides[run % len(sides) :] + sides[: run % len(sides)]
            r: dict = {"order": order, "decode": {}}
            for b in args.batches:
                kw = {"prompts": prompts[b], "max_tokens": args.max_tokens}
                r["decode"][b] = {s: call(s, "decode", **kw) for s in order}
                loads.append(os.getloadavg()[0])
                bar.update()
            r["ttft"] = {s: call(s, "ttft", prompt=long_prompt) for s in order}
            loads.append(os.getloadavg()[0])
            bar.update()
            runs.append(r)
    return sides, runs, loads


def _decode_row(per: dict[str, list[dict]]) -> dict:
    """One batch: each side's medians; each HF side's speed-up (the median of the per-run
    ratios) and greedy agreement against radixray; the peer, the HF side with more tokens/s."""
    med, row = statistics.median, {}
    for s, res in per.items():
        tok_s = [x["tokens_per_s"] for x in res]
        row[s] = {"tok_s": med(tok_s), "ms_step": med(x["ms_per_step"] for x in res)}
        row[s]["tok_s_all"] = tok_s
        if s != "radixray":
            pairs = list(zip(per["radixray"], res, strict=True))
            row[s]["speedup"] = med(m["tokens_per_s"] / t["tokens_per_s"] for m, t in pairs)
            row[s]["agreement"] = med(_agreement(m["outputs"], t["outputs"]) for m, t in pairs)
    row["peer"] = max(list(per)[1:], key=lambda s: row[s]["tok_s"], default=None)
    return row


def _ttft(runs: list[dict], sides: list[str]) -> dict:
    med = statistics.median
    tt = [r["ttft"]["radixray"] for r in runs]
    out = {k: med(t[k] for t in tt) for k in ("cold_s", "cached_s")}
    out["ratio"] = med(t["cached_s"] / t["cold_s"] for t in tt)
    out.update({k: tt[0][k] for k in ("cached_tokens", "prompt_tokens")})
    out.update(cold_all=[t["cold_s"] for t in tt], cached_all=[t["cached_s"] for t in tt])
    out["hf_cold_s"] = {s: med(r["ttft"][s]["cold_s"] for r in runs) for s in sides[1:]}
    out["peer"] = min(out["hf_cold_s"], key=out["hf_cold_s"].get, default=None)
    return out


def _print(summary: dict, sides: list[str]) -> None:
    hf = sides[1:]
    cols = ["batch", "radixray tok/s", *(f"{HF_LABEL[s]} tok/s" for s in hf), "radixray ms/step"]
    cols += PEER_COLUMNS if hf else []
    print("\n| " + " | ".join(cols) + " |\n|" + "---:|" * len(cols))
    for b, row in summary["decode"].items():
        mine = row["radixray"]
        cells = [b, f"{mine['tok_s']:.1f}", *(f"{row[s]['tok_s']:.1f}" for s in hf)]
        cells.append(f"{mine['ms_step']:.0f}")
        if p := row["peer"]:
            cells += [HF_LABEL[p], f"{row[p]['ms_step']:.0f}", f"**{row[p]['speedup']:.2f}x**"]
            cells.append(f"{row[p]['agreement']:.2f}")
        print("| " + " | ".join(map(str, cells)) + " |")
    s = summary["ttft"]
    hf_ttft = ", ".join(f"{HF_LABEL[k]} {v:.2f} s" for k, v in s["hf_cold_s"].items())
    print(
        f"\nTTFT {s['prompt_tokens']} tokens: cold {s['cold_s']:.2f} s, "
        f"{s['cached_tokens']} cached {s['cached_s']:.2f} s, ratio {s['ratio']:.3f}"
        + (f"; transformers cold: {hf_ttft} (peer: {HF_LABEL[s['peer']]})" if hf else "")
    )
    print(
        f"peak RSS (MiB, each child process): {summary['peak_rss_mib']}; peak at the end of "
        f"loading: {summary['rss_after_load_mib']}"
    )


def main(argv: list[str] | None = None) -> dict:
    args = _args(argv)
    import torch

    machine = f"{cpu_model()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    print(f"machine: {machine}; torch {torch.__version__}; threads {args.threads}")
    print(f"load average at start: {os.getloadavg()}")
    t_start = time.time()
    kw = {"num_pages": args.num_pages, "cached_fraction": args.cached_fraction}
    children = {"radixray": Child("radixray", threads=args.threads, **kw)}
    if not args.no_hf:
        children["transformers"] = Child("transformers", threads=args.threads)
    radix, hf = children["radixray"], children.get("transformers")
    need = max(args.ttft_len, max(args.batches) * 37 + args.prompt_len)
    corpus = radix.call("corpus_ids", n=need)
    # prompt i: a window of the corpus at offset 37 * i, so no two share a page-aligned prefix
    prompts = {
        b: [corpus[37 * i : 37 * i + args.prompt_len] for i in range(b)] for b in args.batches
    }
    sides, runs, loads = _measure(args, radix, hf, prompts, corpus[: args.ttft_len])
    med = statistics.median
    summary = {
        "args": vars(args),
        "machine": machine,
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t_start)),
        "wall_s": time.time() - t_start,
        "load_avg_1min": {"min": min(loads), "median": med(loads), "max": max(loads)},
        "hf_attn_implementation": hf.call("attn") if hf else None,
        "decode": {
            b: _decode_row({s: [r["decode"][b][s] for r in runs] for s in sides})
            for b in args.batches
        },
        "ttft": _ttft(runs, sides),
        "peak_rss_mib": {c: child.call("peak_rss") for c, child in children.items()},
        "rss_after_load_mib": {c: child.loaded_rss_mib for c, child in children.items()},
        "runs": runs,
    }
    print(
        f"\nthreads {args.threads}, runs {args.runs} (order rotating: each side leads in turn), "
        f"load average (1 min) during the runs: median {med(loads):.1f} (min {min(loads):.1f}, "
        f"max {max(loads):.1f}); the peer: the better HF variant"
    )
    _print(summary, sides)
    for child in children.values():
        child.close()
    Path(args.json).write_text(json.dumps(summary, indent=1, default=str))
    print(f"wrote {args.json}; wall {summary['wall_s']:.0f} s")
    if args.plot:
        _plot(summary, args.plot)
        print(f"wrote {args.plot}")
    return summary


def _plot(summary: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    decode, t = summary["decode"], summary["ttft"]
    sides = [s for s in ("radixray", *HF_LABEL) if s in next(iter(decode.values()))]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 3.2), dpi=80)
    width = 0.8 / len(sides)
    for k, s in enumerate(sides):
        xs = [i + (k - (len(sides) - 1) / 2) * width for i in range(len(decode))]
        ax1.bar(xs, [row[s]["tok_s"] for row in decode.values()], width, label=HF_LABEL.get(s, s))
    ax1.set_xticks(list(range(len(decode))), [str(b) for b in decode])
    ax1.set(xlabel="batch", ylabel="decode tokens/s")
    ax1.legend(fontsize=7)
    labels = ["radixray cold", f"radixray {t['cached_tokens']} cached"]
    labels += [f"{HF_LABEL[s]} cold" for s in t["hf_cold_s"]]
    vals = [t["cold_s"], t["cached_s"], *t["hf_cold_s"].values()]
    ax2.barh(labels, vals, color=["C0", "C0", "C1", "C2"][: len(vals)])
    ax2.set_xlabel(f"TTFT (s), {t['prompt_tokens']}-token prompt")
    fig.suptitle(f"SmolLM2-135M fp32, CPU, {summary['args']['threads']} thread(s), medians")
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    main()
