"""The engine on a GPU: greedy tokens equal the CPU's, and decode speed (benchmarks/gpu/run.sh).

    python benchmarks/gpu/engine_check.py --device cuda --json out.json   # SmolLM2's shapes
    python benchmarks/gpu/engine_check.py --quick --json out.json        # CPU, tiny model (s)

The model is SmolLM2-135M's architecture (smollm2_config.json beside this file, read from the
GGUF's metadata) with seeded random weights (``random_hf_state_dict``: the same on every
machine), not the real GGUF: 98 MB does not fit one device call's carry, and the speed and the
exactness questions depend on the shapes, not on the weights' values. No tokenizer: prompts are
token ids.

- **exactness**: float32 on both sides; each prompt alone on the CPU against all of them batched
  on --device (radix cache on, page 16): the greedy tokens must be equal. The first position
  that differs is kept per prompt. Exit status 1 when any differs.
- **decode**: tokens/s at batch 1, 8, 64 for bfloat16 and float32, as benchmarks/bench_engine.py
  measures it (distinct prompts of --prompt-len tokens submitted at once, greedy, EOS ignored;
  the window starts once every request has its first token); a warm-up run, then the median of
  --runs fresh engines.
- **host** (optional, ``--host``): the host tier's copies overlapped layer by layer with the
  forward (the engine's way) against all of a step's copies run before the forward (the way a
  fork's copies run): wall time of the steps that copy, same workload, same outputs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from radixray.model_meta import ModelConfig, tiny_config  # noqa: E402
from radixray.worker import Engine, EngineConfig, SamplingParams  # noqa: E402
from radixray.worker.model.linear import pack_linears  # noqa: E402
from radixray.worker.model.llama import LlamaModel  # noqa: E402
from radixray.worker.model.loader import random_hf_state_dict  # noqa: E402

HERE = Path(__file__).resolve().parent
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
PAGE = 16


def model_config(quick: bool) -> ModelConfig:
    """SmolLM2-135M's config (the JSON's lists back to the dataclass's tuples), or the tiny one."""
    if quick:
        return tiny_config(tie_word_embeddings=True)
    raw = json.loads((HERE / "smollm2_config.json").read_text())
    fields = {f.name: f for f in dataclasses.fields(ModelConfig)}
    for name, value in raw.items():
        if isinstance(value, list):
            raw[name] = tuple(tuple(v) if isinstance(v, list) else v for v in value)
    assert set(raw) <= set(fields), set(raw) - set(fields)
    return ModelConfig(**raw)


def load(mcfg: ModelConfig, device: str, dtype: str, seed: int = 0):
    """(model, config, None): the loader's steps, on random weights."""
    model = LlamaModel(mcfg, device=torch.device(device), dtype=DTYPES[dtype])
    model.load_hf_state_dict(random_hf_state_dict(mcfg, seed))
    pack_linears(model)
    return model.eval(), mcfg, None


def engine(loaded, device: str, dtype: str, **kw) -> Engine:
    cfg = {
        "model": "smollm2-random",
        "device": device,
        "dtype": dtype,
        "page_size": PAGE,
        "host_pages": 0,
        "seed": 0,
    }
    return Engine(EngineConfig(**(cfg | kw)), loaded=loaded)


def prompts(mcfg: ModelConfig, n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, mcfg.vocab_size) for _ in range(length)] for _ in range(n)]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def check_exactness(mcfg, device: str, n: int, max_tokens: int) -> dict:
    """Each prompt alone on the CPU vs all batched on ``device``, float32, greedy."""
    rng = random.Random(1)
    ps = [prompts(mcfg, 1, rng.randint(5, 200), seed=100 + i)[0] for i in range(n)]
    ps += [ps[0][:40] + p for p in ps[1:3]]  # shared prefixes: the radix cache serves them
    cpu = engine(load(mcfg, "cpu", "float32"), "cpu", "float32", num_pages=256, max_running=1)
    want = [cpu.generate_batch([p], greedy(max_tokens))[0].token_ids for p in ps]
    loaded = load(mcfg, device, "float32")
    dev = engine(loaded, device, "float32", num_pages=1024, overlap="on")
    got = [o.token_ids for o in dev.generate_batch(ps, greedy(max_tokens))]
    diff = [first_difference(w, g) for w, g in zip(want, got, strict=True)]
    dev.shutdown()
    serial = engine(loaded, device, "float32", num_pages=1024, overlap="off")
    ser = [o.token_ids for o in serial.generate_batch(ps, greedy(max_tokens))]
    return {
        "overlap_equal": ser == got,  # the overlapped loop's tokens against the serial loop's
        "overlap_first_difference": [first_difference(a, b) for a, b in zip(ser, got, strict=True)],
        "dtype": "float32",
        "reference": "cpu, one prompt at a time",
        "prompts": len(ps),
        "prompt_lens": [len(p) for p in ps],
        "max_tokens": max_tokens,
        "equal": all(d is None for d in diff),
        "first_difference": diff,
        "attention": dev.runner.attention.name,
        "cuda_graphs": dev.runner.graphs is not None,
    }


def decode_run(e: Engine, ps: list[list[int]], max_tokens: int) -> dict:
    """bench_engine.py's decode window: from every request's first token to the last token."""
    for p in ps:
        e.add_request(p, greedy(max_tokens))
    started, tokens, seconds, steps = 0, 0, 0.0, 0
    while e.has_work():
        t0 = time.perf_counter()
        chunks = e.step()
        dt = time.perf_counter() - t0
        if started == len(ps):
            tokens += sum(len(c.token_ids) for c in chunks)
            seconds += dt
            steps += 1
        started = max(started, len(chunks))
    return {"tokens_per_s": tokens / seconds, "ms_per_step": 1000 * seconds / steps}


def measure_decode(mcfg, device, dtypes, batches, prompt_len, max_tokens, runs) -> list[dict]:
    """Each (dtype, batch) on CUDA with graphs and overlapped steps (the engine's defaults;
    graphs captured when the engine starts, outside the window), without graphs
    (``cuda_graph_max_batch=0``), and in bfloat16 with graphs and the serial loop
    (``overlap="off"``); on a CPU, eager and serial (its default)."""
    rows = []
    for dtype in dtypes:
        loaded = load(mcfg, device, dtype)
        variants = [(0, "off")]
        if device.startswith("cuda"):
            variants = [(256, "on"), (0, "on")] + ([(256, "off")] if dtype == "bfloat16" else [])
        for batch in batches:
            for graph_batch, overlap in variants:
                rows.append(
                    decode_row(
                        loaded,
                        device,
                        dtype,
                        batch,
                        (graph_batch, overlap),
                        prompt_len,
                        max_tokens,
                        runs,
                    )
                )
                row = rows[-1]
                print(
                    f"| {dtype} | {batch} | {'yes' if row['cuda_graphs'] else 'no'} | "
                    f"{overlap} | {row['tokens_per_s']:.0f} | {row['ms_per_step']:.2f} |",
                    flush=True,
                )
        del loaded
    return rows


def decode_row(loaded, device, dtype, batch, variant, prompt_len, max_tokens, runs) -> dict:
    """``variant``: (cuda_graph_max_batch, overlap)."""
    mcfg = loaded[1]
    pages = batch * (-(-(prompt_len + max_tokens) // PAGE) + 1) + 16
    kw = {"num_pages": pages, "max_running": batch, "max_batch_tokens": 4096}
    kw["cuda_graph_max_batch"], kw["overlap"] = variant
    each, graphs = [], False
    for r in range(runs + 1):  # run 0 warms up (kernels compile, allocator grows)
        ps = prompts(mcfg, batch, prompt_len, seed=1000 * r + batch)
        e = engine(loaded, device, dtype, **kw)
        graphs = e.runner.graphs is not None
        res = decode_run(e, ps, max_tokens)
        e.shutdown()
        if r:
            each.append(res)
    row = {"dtype": dtype, "batch": batch, "cuda_graphs": graphs, "overlap": kw["overlap"]}
    row["runs"] = each
    for key in ("tokens_per_s", "ms_per_step"):
        row[key] = statistics.median(x[key] for x in each)
    return row


def measure_host(mcfg, device: str, prompt_len: int, reps: int) -> dict:
    """Copy-heavy steps: a device pool of ~1.5 long prompts and a host tier of all of them;
    prompts A, B, A, B, ... (each evicts the other to the host, each comes back from it)."""
    from radixray.worker.memory_pool import KVPool

    loaded = load(mcfg, device, "bfloat16" if device != "cpu" else "float32")
    dtype = "bfloat16" if device != "cpu" else "float32"
    pair = prompts(mcfg, 2, prompt_len, seed=7)
    pages = 3 * (prompt_len // PAGE) // 2 + 4
    at_once = KVPool.host_copies

    def run(layered: bool) -> dict:
        KVPool.host_copies = (
            at_once
            if layered
            else (lambda self, c, layered=False, wait=False: at_once(self, c, False, wait))
        )
        try:
            e = engine(
                loaded, device, dtype, num_pages=pages, host_pages=4 * pages, max_batch_tokens=512
            )
            times, outs = [], []
            for i in range(2 * reps):
                before = e.stats()["loaded_pages"] + e.stats()["demoted_pages"]
                t0 = time.perf_counter()
                outs.append(e.generate_batch([pair[i % 2]], greedy(4))[0].token_ids)
                dt = time.perf_counter() - t0
                moved = e.stats()["loaded_pages"] + e.stats()["demoted_pages"] - before
                if i >= 2:  # the first of each is cold: nothing to load back
                    times.append((dt, moved))
            s = e.stats()
            return {
                "request_s_median": statistics.median(t for t, _ in times),
                "pages_moved_per_request": statistics.median(m for _, m in times),
                "loaded_pages": s["loaded_pages"],
                "demoted_pages": s["demoted_pages"],
                "outputs": outs,
            }
        finally:
            KVPool.host_copies = at_once

    layered, before = run(True), run(False)
    same = layered.pop("outputs") == before.pop("outputs")
    return {
        "prompt_len": prompt_len,
        "device_pages": pages,
        "layered": layered,
        "before_forward": before,
        "same_outputs": same,
    }


def device_info(device: str) -> dict:
    info = {"torch": torch.__version__, "python": platform.python_version(), "device": device}
    if device.startswith("cuda"):
        info["name"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
        try:
            import triton

            info["triton"] = triton.__version__
        except ImportError:
            info["triton"] = None
    else:
        info["name"] = platform.processor() or platform.machine()
        info["threads"] = torch.get_num_threads()
    return info


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="CPU, tiny model, short runs")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"], choices=DTYPES)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=64, help="new tokens per decode run")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--exact-prompts", type=int, default=6)
    ap.add_argument("--exact-tokens", type=int, default=32)
    ap.add_argument("--host", action="store_true", help="also the host tier's copy overlap")
    ap.add_argument("--host-prompt-len", type=int, default=4096)
    if ap.parse_known_args()[0].quick:  # smaller defaults; flags given still win
        ap.set_defaults(device="cpu", batches=[1, 4], max_tokens=8, prompt_len=24)
        ap.set_defaults(exact_prompts=3, exact_tokens=6, host_prompt_len=256)
    args = ap.parse_args()
    torch.manual_seed(0)
    mcfg = model_config(args.quick)
    out = {
        "info": device_info(args.device),
        "model": {
            "weights": "random (random_hf_state_dict, seed 0)",
            "architecture": "tiny" if args.quick else "SmolLM2-135M",
            "config": dataclasses.asdict(mcfg),
        },
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    print(f"# {out['info']}", flush=True)
    out["exactness"] = check_exactness(mcfg, args.device, args.exact_prompts, args.exact_tokens)
    ex = out["exactness"]
    print(f"exactness vs CPU: {'EQUAL' if ex['equal'] else 'DIFFERENT'} {ex['first_difference']}")
    same = "EQUAL" if ex["overlap_equal"] else "DIFFERENT"
    print(f"overlapped vs serial: {same} {ex['overlap_first_difference']}")
    print("| dtype | batch | CUDA graphs | overlap | decode tokens/s | ms/step |", flush=True)
    print("|---|---:|---|---|---:|---:|", flush=True)
    out["decode"] = measure_decode(
        mcfg,
        args.device,
        args.dtypes,
        args.batches,
        args.prompt_len,
        args.max_tokens,
        args.runs,
    )
    if args.host:
        out["host"] = measure_host(mcfg, args.device, args.host_prompt_len, 3)
        h = out["host"]
        print(
            f"host tier, request s (median): layered {h['layered']['request_s_median']:.4f}, "
            f"before the forward {h['before_forward']['request_s_median']:.4f}; "
            f"same outputs: {h['same_outputs']}"
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0 if ex["equal"] and ex["overlap_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
