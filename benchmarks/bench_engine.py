"""Worker engine benchmark: radixray vs HF transformers on SmolLM2-135M-Instruct, float32, CPU.

    python benchmarks/bench_engine.py                 # 3 runs, threads 1, ~6 min on 2 busy cores
    python benchmarks/bench_engine.py --runs 5 --threads 2 --plot benchmarks/bench_engine.png
    python benchmarks/bench_engine.py --quick         # 1 run, tiny sizes: a smoke test (seconds)

Both sides load the same GGUF (radixray's loader; transformers' ``from_pretrained(gguf_file=)``),
run with the same fixed number of torch intra-op threads, in two child processes that the parent
drives alternately (radixray, then transformers, for every measurement), so slow phases of a
shared machine hit both sides alike. Each child reports its own peak RSS.

Measured, per run:

- **decode tokens/s at batch 1, 8, 16**: the same prompts (windows of real text, --prompt-len
  tokens, distinct so nothing is shared), greedy, --max-tokens new tokens, EOS ignored.
  radixray: all requests submitted at once to one engine (continuous batching, radix cache on);
  transformers: ``generate`` on the batch (no padding: prompts have equal length). The decode
  window starts once every request has its first token (after the last prefill) and ends with
  the last token: tokens produced in it / its wall time. transformers' window is timed with a
  logits processor (called once per forward, right after it).
- **TTFT of a 2,048-token prompt**: cold (fresh engine) vs with its first 90% cached (the engine
  first served a prompt made of those 90%; page-aligned reuse gives 1,840 of 2,048 tokens).
  TTFT = wall time of ``generate_batch([prompt], max_tokens=1)``. transformers' cold prefill of
  the same prompt (``generate``, one new token) is shown for reference.

Medians over --runs; the JSON of every run goes to --json.
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from radixray.sim.data import data_text  # noqa: E402
from radixray.sysinfo import cpu_model  # noqa: E402

# ---------------------------------------------------------------------------------------------
# children: one serves radixray, one transformers; each answers (command, kwargs) messages
# ---------------------------------------------------------------------------------------------


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _corpus_text() -> str:
    """Real text for prompts: the sonnets and the MT-bench questions, concatenated."""
    parts = [data_text("text_prompts/sonnet_llmperf.txt")]
    for line in data_text("text_prompts/mt_bench_question.jsonl").splitlines():
        if line.strip():
            parts += json.loads(line).get("turns", [])
    return "\n\n".join(parts)


class RadixSide:
    def __init__(self, threads: int, num_pages: int):
        import torch

        from radixray.worker import EngineConfig
        from radixray.worker.model_runner import load_for_engine

        torch.set_num_threads(threads)
        self.threads, self.num_pages = threads, num_pages
        self.config = EngineConfig(model="smollm2", num_pages=num_pages, cpu_threads=threads)
        self.loaded = load_for_engine(self.config, torch.device("cpu"))

    def _engine(self, **changes):
        from dataclasses import replace

        from radixray.worker import Engine

        return Engine(replace(self.config, **changes), loaded=self.loaded)

    def corpus_ids(self, n: int) -> list[int]:
        ids = self.loaded[2].encode(_corpus_text())
        return (ids * (n // len(ids) + 1))[:n]

    def decode(self, prompts: list[list[int]], max_tokens: int) -> dict:
        from radixray.worker import SamplingParams

        engine = self._engine()
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
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
        return {
            "tokens_per_s": window_tokens / window_s,
            "ms_per_step": 1000 * window_s / steps,
            "outputs": outputs,
        }

    def ttft(self, prompt: list[int], cached_fraction: float) -> dict:
        from radixray.worker import SamplingParams

        one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        cold = self._engine()
        t0 = time.perf_counter()
        out_cold = cold.generate_batch([prompt], one)[0]
        cold_s = time.perf_counter() - t0
        warm = self._engine()
        warm.generate_batch([prompt[: int(len(prompt) * cached_fraction)]], one)
        t0 = time.perf_counter()
        out_warm = warm.generate_batch([prompt], one)[0]
        warm_s = time.perf_counter() - t0
        assert out_warm.token_ids == out_cold.token_ids, "reuse changed the first token"
        return {
            "cold_s": cold_s,
            "cached_s": warm_s,
            "cached_tokens": out_warm.cached_tokens,
            "prompt_tokens": out_warm.prompt_tokens,
        }


class HFSide:
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
        self.attn = self.model.config._attn_implementation

    def _generate(self, prompts: list[list[int]], max_tokens: int) -> tuple[list[float], list]:
        import torch
        from transformers import LogitsProcessor, LogitsProcessorList

        stamps: list[float] = []

        class Stamp(LogitsProcessor):  # called once per forward, just after it
            def __call__(self, input_ids, scores):
                stamps.append(time.perf_counter())
                return scores

        ids = torch.tensor(prompts, dtype=torch.int64)
        with torch.inference_mode():
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_tokens,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
                logits_processor=LogitsProcessorList([Stamp()]),
            )
        return stamps, out[:, ids.shape[1] :].tolist()

    def decode(self, prompts: list[list[int]], max_tokens: int) -> dict:
        stamps, outputs = self._generate(prompts, max_tokens)
        assert len(stamps) == max_tokens, f"generate stopped after {len(stamps)} tokens"
        steps = len(stamps) - 1
        window_s = stamps[-1] - stamps[0]
        return {
            "tokens_per_s": len(prompts) * steps / window_s,
            "ms_per_step": 1000 * window_s / steps,
            "outputs": outputs,
        }

    def ttft(self, prompt: list[int]) -> dict:
        t0 = time.perf_counter()
        self._generate([prompt], 1)
        return {"cold_s": time.perf_counter() - t0}


def _child(side: str, conn, kwargs: dict) -> None:
    try:
        obj = RadixSide(**kwargs) if side == "radixray" else HFSide(**kwargs)
        conn.send(("ready", {"peak_rss_mib": _peak_rss_mib(), "attn": getattr(obj, "attn", None)}))
        while True:
            cmd, args = conn.recv()
            if cmd == "stop":
                break
            result = getattr(obj, cmd)(**args)
            if isinstance(result, dict):
                result["peak_rss_mib"] = _peak_rss_mib()
            conn.send(("ok", result))
    except Exception as e:  # report, so that the parent fails with the child's reason
        import traceback

        conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


class Child:
    def __init__(self, side: str, **kwargs):
        ctx = mp.get_context("spawn")
        self.conn, child_conn = ctx.Pipe()
        self.proc = ctx.Process(target=_child, args=(side, child_conn, kwargs), daemon=True)
        self.proc.start()
        self.side = side
        self.ready = self._recv()

    def _recv(self):
        status, payload = self.conn.recv()
        if status == "error":
            raise RuntimeError(f"{self.side} child failed: {payload}")
        return payload

    def call(self, cmd: str, **args):
        self.conn.send((cmd, args))
        return self._recv()

    def close(self) -> None:
        self.conn.send(("stop", {}))
        self.proc.join(timeout=30)


# ---------------------------------------------------------------------------------------------
# parent
# ---------------------------------------------------------------------------------------------


def _agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Mean length of the common greedy prefix, as a fraction of the output length."""
    fracs = []
    for x, y in zip(a, b, strict=True):
        n = next((i for i, (u, v) in enumerate(zip(x, y, strict=False)) if u != v), len(x))
        fracs.append(n / max(1, len(x)))
    return statistics.mean(fracs)


def _machine() -> str:
    return f"{cpu_model()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> dict:
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
    ap.add_argument(
        "--quick", action="store_true", help="a smoke run: 1 run, batches 1 and 2, tiny sizes"
    )
    ap.add_argument("--json", default="/tmp/bench_engine.json")
    ap.add_argument("--plot", default=None, help="write a PNG of the comparison here")
    args = ap.parse_args(argv)
    if args.quick:
        args.runs, args.batches, args.prompt_len = 1, [1, 2], 32
        args.ttft_len, args.max_tokens = 128, 4

    import torch
    from tqdm import tqdm

    print(f"machine: {_machine()}; torch {torch.__version__}; threads {args.threads}")
    print(f"load average at start: {os.getloadavg()}")
    t_start = time.time()
    radix = Child("radixray", threads=args.threads, num_pages=args.num_pages)
    hf = None if args.no_hf else Child("transformers", threads=args.threads)
    need = max(args.ttft_len, max(args.batches) * 37 + args.prompt_len)
    corpus = radix.call("corpus_ids", n=need)
    # prompt i: a window of the corpus at offset 37 * i, so no two share a page-aligned prefix
    prompts = {
        b: [corpus[37 * i : 37 * i + args.prompt_len] for i in range(b)] for b in args.batches
    }
    long_prompt = corpus[: args.ttft_len]

    runs: list[dict] = []
    loads: list[float] = []
    total = args.runs * (len(args.batches) + 1)
    with tqdm(total=total, desc="bench_engine", unit="case") as bar:
        for run in range(args.runs):
            r: dict = {"decode": {}, "agreement": {}}
            for b in args.batches:
                bar.set_postfix_str(f"run {run + 1}: decode batch {b}")
                mine = radix.call("decode", prompts=prompts[b], max_tokens=args.max_tokens)
                r["decode"][b] = {"radixray": mine}
                if hf is not None:
                    theirs = hf.call("decode", prompts=prompts[b], max_tokens=args.max_tokens)
                    r["decode"][b]["transformers"] = theirs
                    r["agreement"][b] = _agreement(mine["outputs"], theirs["outputs"])
                loads.append(os.getloadavg()[0])
                bar.update()
            bar.set_postfix_str(f"run {run + 1}: TTFT {args.ttft_len}")
            r["ttft"] = {
                "radixray": radix.call(
                    "ttft", prompt=long_prompt, cached_fraction=args.cached_fraction
                )
            }
            if hf is not None:
                r["ttft"]["transformers"] = hf.call("ttft", prompt=long_prompt)
            loads.append(os.getloadavg()[0])
            bar.update()
            runs.append(r)

    def med(values) -> float:
        return statistics.median(values)

    summary: dict = {
        "args": vars(args),
        "machine": _machine(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t_start)),
        "wall_s": time.time() - t_start,
        "load_avg_1min": {"min": min(loads), "median": med(loads), "max": max(loads)},
        "hf_attn_implementation": hf.ready["attn"] if hf is not None else None,
        "decode": {},
        "runs": runs,
    }
    print(
        f"\nthreads {args.threads}, runs {args.runs}, load average (1 min) during the runs: "
        f"median {med(loads):.1f} (min {min(loads):.1f}, max {max(loads):.1f})"
    )
    print(
        "\n| batch | radixray tok/s | transformers tok/s | speed-up | radixray ms/step "
        "| transformers ms/step | greedy agreement |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for b in args.batches:
        mine = [r["decode"][b]["radixray"] for r in runs]
        row = {
            "radixray_tok_s": med(m["tokens_per_s"] for m in mine),
            "radixray_ms_step": med(m["ms_per_step"] for m in mine),
            "radixray_tok_s_all": [m["tokens_per_s"] for m in mine],
        }
        if hf is not None:
            theirs = [r["decode"][b]["transformers"] for r in runs]
            row.update(
                transformers_tok_s=med(t["tokens_per_s"] for t in theirs),
                transformers_ms_step=med(t["ms_per_step"] for t in theirs),
                transformers_tok_s_all=[t["tokens_per_s"] for t in theirs],
                speedup=med(
                    m["tokens_per_s"] / t["tokens_per_s"] for m, t in zip(mine, theirs, strict=True)
                ),
                agreement=med(r["agreement"][b] for r in runs),
            )
        summary["decode"][b] = row
        if hf is not None:
            print(
                f"| {b} | {row['radixray_tok_s']:.1f} | {row['transformers_tok_s']:.1f} | "
                f"{row['speedup']:.2f}x | {row['radixray_ms_step']:.0f} | "
                f"{row['transformers_ms_step']:.0f} | {row['agreement']:.2f} |"
            )
        else:
            print(f"| {b} | {row['radixray_tok_s']:.1f} | - | - | {row['radixray_ms_step']:.0f} |")
    tt = [r["ttft"]["radixray"] for r in runs]
    summary["ttft"] = {
        "cold_s": med(t["cold_s"] for t in tt),
        "cached_s": med(t["cached_s"] for t in tt),
        "ratio": med(t["cached_s"] / t["cold_s"] for t in tt),
        "cached_tokens": tt[0]["cached_tokens"],
        "prompt_tokens": tt[0]["prompt_tokens"],
        "cold_all": [t["cold_s"] for t in tt],
        "cached_all": [t["cached_s"] for t in tt],
    }
    if hf is not None:
        summary["ttft"]["transformers_cold_s"] = med(
            r["ttft"]["transformers"]["cold_s"] for r in runs
        )
    s = summary["ttft"]
    print(
        f"\nTTFT {s['prompt_tokens']} tokens: cold {s['cold_s']:.2f} s, "
        f"{s['cached_tokens']} cached {s['cached_s']:.2f} s, ratio {s['ratio']:.3f}"
        + (f"; transformers cold {s['transformers_cold_s']:.2f} s" if hf else "")
    )
    summary["peak_rss_mib"] = {"radixray": runs[-1]["ttft"]["radixray"]["peak_rss_mib"]}
    if hf is not None:
        summary["peak_rss_mib"]["transformers"] = runs[-1]["ttft"]["transformers"]["peak_rss_mib"]
    summary["rss_after_load_mib"] = {"radixray": radix.ready["peak_rss_mib"]}
    if hf is not None:
        summary["rss_after_load_mib"]["transformers"] = hf.ready["peak_rss_mib"]
    print(
        f"peak RSS (MiB, each child process): {summary['peak_rss_mib']}; peak at the end of "
        f"loading: {summary['rss_after_load_mib']}"
    )
    radix.close()
    if hf is not None:
        hf.close()
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

    batches = list(summary["decode"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 3.2), dpi=80)
    x = range(len(batches))
    mine = [summary["decode"][b]["radixray_tok_s"] for b in batches]
    ax1.bar([i - 0.2 for i in x], mine, 0.4, label="radixray")
    if "transformers_tok_s" in summary["decode"][batches[0]]:
        theirs = [summary["decode"][b]["transformers_tok_s"] for b in batches]
        ax1.bar([i + 0.2 for i in x], theirs, 0.4, label="transformers generate")
    ax1.set_xticks(list(x), [str(b) for b in batches])
    ax1.set_xlabel("batch")
    ax1.set_ylabel("decode tokens/s")
    ax1.legend(fontsize=8)
    t = summary["ttft"]
    labels = ["radixray cold", f"radixray {t['cached_tokens']} cached"]
    vals = [t["cold_s"], t["cached_s"]]
    if "transformers_cold_s" in t:
        labels.append("transformers cold")
        vals.append(t["transformers_cold_s"])
    ax2.barh(labels, vals, color=["C0", "C2", "C1"][: len(vals)])
    ax2.set_xlabel(f"TTFT (s), {t['prompt_tokens']}-token prompt")
    threads = summary["args"]["threads"]
    fig.suptitle(f"SmolLM2-135M fp32, CPU, {threads} thread(s), medians", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    main()
