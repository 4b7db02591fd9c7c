"""The host tier on this machine: a prompt loaded back from host memory vs the same prompt
recomputed, and load-back bandwidth vs a plain copy of the same bytes.

    python benchmarks/bench_host_tier.py            # SmolLM2-135M, a 2,048-token prompt, 3 repeats
    python benchmarks/bench_host_tier.py --quick    # the tiny model, 256 tokens, 1 repeat

Two engines share the loaded model; each has a device pool that holds one prompt but not two
(the working set), and one has a host tier that holds both. Each serves prompt A, then a
distinct prompt B of the same length (which pushes A out of the device pool: demoted to the host
tier on one engine, forgotten on the other), then A again. A's second TTFT (inside the engine:
from taking the request to its first token) is a load-back on the tiered engine and a
recompute on the other; the greedy tokens must be identical.

Bandwidth: the pool's ``copy_in`` of A's pages (host -> device pool, every layer's K and V) vs
``Tensor.copy_`` of one contiguous buffer of the same bytes (what a memory copy costs here).
Targets (issue 24): TTFT ratio <= 0.25x, bandwidth >= 0.5x.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from radixray.sim.data import data_text  # noqa: E402
from radixray.sysinfo import cpu_model  # noqa: E402
from radixray.worker import Engine, EngineConfig, SamplingParams  # noqa: E402
from radixray.worker.model_runner import load_for_engine  # noqa: E402

PAGE = 16


def corpus(model: str, loaded) -> list[int]:
    if model == "tiny":
        g = torch.Generator().manual_seed(0)
        return torch.randint(3, loaded[1].vocab_size, (8192,), generator=g).tolist()
    return loaded[2].encode(data_text("text_prompts/sonnet_llmperf.txt"))


def prompts(ids: list[int], length: int) -> tuple[list[int], list[int]]:
    """Two prompts of ``length`` tokens sharing no page."""
    ids = ids * (2 * length // len(ids) + 2)
    a = ids[:length]
    b = list(reversed(ids[length : 3 * length]))[:length]
    return a, b


def run_engine(config: EngineConfig, loaded, a, b, max_tokens: int) -> dict:
    e = Engine(config, loaded=loaded)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    e.generate_batch([a], params)
    e.generate_batch([b], params)  # A leaves the device pool
    (out,) = e.generate_batch([a], params)
    _, cached, ttft = e.meter.first_token_log[-1]
    s = e.stats()
    return {
        "ttft_s": ttft,
        "tokens": out.token_ids,
        "host_tokens": out.miss.get("host", 0),
        "cached_tokens": cached,
        "loaded_pages": s.get("loaded_pages", 0),
        "engine": e,
    }


def bandwidth(engine: Engine, pages: int, repeats: int = 5) -> tuple[float, float]:
    """(load-back GB/s, plain copy GB/s) over ``pages`` pages."""
    pool = engine.pool
    src, dst = list(range(pages)), list(range(pages))
    nbytes = pages * pool.page_bytes
    flat_src = torch.empty(nbytes // 4, dtype=torch.float32)
    flat_dst = torch.empty_like(flat_src)
    flat_src.fill_(1.0), flat_dst.fill_(0.0)  # touch every page before timing
    pool.host.copy_in(src, dst)
    load, plain = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        pool.host.copy_in(src, dst)
        load.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        flat_dst.copy_(flat_src)
        plain.append(time.perf_counter() - t0)
    return nbytes / min(load) / 1e9, nbytes / min(plain) / 1e9


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the tiny model, 256 tokens, 1 repeat")
    ap.add_argument("--prompt-len", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--json", help="write every measurement here")
    args = ap.parse_args(argv)
    model = "smollm2"
    if args.quick:
        model, args.prompt_len, args.repeats = "tiny", 256, 1
    torch.set_num_threads(args.threads)
    max_tokens = 8
    per_prompt = -(-(args.prompt_len + max_tokens) // PAGE)
    base = {"model": model, "page_size": PAGE, "device": "cpu", "seed": 0}
    base["cpu_threads"] = args.threads
    base["num_pages"] = per_prompt + per_prompt // 2  # one prompt fits, two do not
    loaded = load_for_engine(EngineConfig(**base), torch.device("cpu"))
    a, b = prompts(corpus(model, loaded), args.prompt_len)
    runs: dict[str, list[float]] = {"load_s": [], "recompute_s": [], "load_gbs": [], "copy_gbs": []}
    for r in range(args.repeats):
        tiered = run_engine(
            EngineConfig(**base, host_pages=4 * per_prompt), loaded, a, b, max_tokens
        )
        plain = run_engine(EngineConfig(**base, host_pages=0), loaded, a, b, max_tokens)
        assert tiered["tokens"] == plain["tokens"], "load-back changed the output"
        assert tiered["host_tokens"] > 0 and plain["host_tokens"] == 0
        runs["load_s"].append(tiered["ttft_s"])
        runs["recompute_s"].append(plain["ttft_s"])
        load_gbs, copy_gbs = bandwidth(tiered["engine"], per_prompt - 1)
        runs["load_gbs"].append(load_gbs)
        runs["copy_gbs"].append(copy_gbs)
        print(f"repeat {r + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    machine = f"{cpu_model()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    print(f"{model}, {machine}, torch threads {args.threads}, medians of {args.repeats}")
    print(f"| {args.prompt_len}-token prompt | TTFT ms | vs recompute |")
    print("|---|---:|---:|")
    ratio = med["load_s"] / med["recompute_s"]
    print(f"| recomputed | {1000 * med['recompute_s']:.1f} | 1.00x |")
    print(f"| loaded back from host | {1000 * med['load_s']:.1f} | {ratio:.3f}x |")
    print()
    bw = med["load_gbs"] / med["copy_gbs"]
    print("| copy of one prompt's KV pages | GB/s | vs plain copy |")
    print("|---|---:|---:|")
    print(f"| Tensor.copy_, one buffer | {med['copy_gbs']:.2f} | 1.00x |")
    print(f"| load-back (copy_in of the pages) | {med['load_gbs']:.2f} | {bw:.2f}x |")
    result = {"model": model, "machine": machine, "args": vars(args), "runs": runs, "medians": med}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
