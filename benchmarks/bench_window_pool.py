"""KV bytes of one 8k-token sequence on Gemma-3-270M's layout: the window-aware pool (window
layers in their own pool, pages out of the window given back as the request runs) against the
plain pool (every layer keeps every page). docs/window_cache.md.

The numbers come from the real pools' page accounting: the engine's ``KVPool.for_model`` builds
both pools (tensors and allocators) for the same ModelConfig, and the scheduler runs one request
through chunked prefill and decode (no model: the KV is not computed, only the pages move as
they would). At each step the bytes in use are the full pool's pages in use times its page
bytes plus the window pool's pages in use times its page bytes.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_window_pool.py [--tokens 8192] [--quick]
"""

from __future__ import annotations

import argparse

import torch

from radixray.cache_index import hash_blocks, make_cache
from radixray.model_meta.model_config import ModelConfig
from radixray.protocol import SamplingParams
from radixray.worker import EngineConfig
from radixray.worker.memory_pool import KVPool
from radixray.worker.request import Request
from radixray.worker.scheduler import Scheduler, SchedulerConfig

# google/gemma-3-270m's config.json: 18 layers, every sixth full attention (5:1), the rest
# sliding windows of 512; 4 query heads over 1 KV head of 256; KV in bfloat16.
WINDOW = 512
GEMMA3_270M = ModelConfig(
    vocab_size=262144,
    hidden_size=640,
    intermediate_size=2048,
    num_layers=18,
    num_heads=4,
    num_kv_heads=1,
    head_dim=256,
    max_position_embeddings=32768,
    name="gemma-3-270m",
    architecture="gemma3_text",
    layer_windows=tuple(None if i % 6 == 5 else WINDOW for i in range(18)),
)


def run(cache: str, tokens: int, output: int, page_size: int, chunk: int) -> dict:
    """One request of ``tokens - output`` prompt tokens and ``output`` decoded ones."""
    num_pages = -(-tokens // page_size) + 8
    config = EngineConfig(
        model="none",
        cache=cache,
        page_size=page_size,
        num_pages=num_pages,
        dtype="bfloat16",
        max_batch_tokens=chunk,
        host_pages=0,
    )
    pool = KVPool.for_model(GEMMA3_270M, config, torch.device("cpu"), tokens, cache)
    sched = Scheduler(
        make_cache(cache, page_size, pool.allocator),
        SchedulerConfig(max_batch_tokens=chunk, max_running=1),
    )
    prompt = [(i * 7919) % 50000 for i in range(tokens - output)]
    params = SamplingParams(max_tokens=output, ignore_eos=True)
    req = Request("r", prompt, params, hash_blocks(prompt, page_size))
    sched.add(req)
    alloc, peak = pool.allocator, 0
    win_bytes = pool.window_page_bytes

    def used() -> int:
        n = alloc.num_used * pool.page_bytes
        if pool.window_k is not None:
            n += (alloc.window_allocator.num_used - 1) * win_bytes  # the NULL page not counted
        return n

    while req.num_tokens < tokens or req.in_prefill:
        batch = sched.schedule()
        peak = max(peak, used())  # pages for this step's tokens are taken before the forward
        sched.postprocess(batch)
        if not req.in_prefill:
            req.output_ids.append(1)  # the sampled token
        sched.check_integrity()
    at_end = pool.held_bytes(req.pages)
    held_window = sum(map(alloc.has_window, req.pages)) if pool.window_k is not None else None
    sched.finish(req, "length")
    return {
        "cache": cache,
        "pool": "window-aware" if pool.window_k is not None else "plain",
        "full_pages": -(-tokens // page_size),
        "window_pages_held": held_window,
        "bytes_at_end": at_end,
        "peak_bytes": peak,
        "cached_after_bytes": used(),
        "pool_bytes_per_token_all_layers": pool.page_bytes // page_size + win_bytes // page_size,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--output", type=int, default=192, help="decoded tokens of the sequence")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=1024, help="max_batch_tokens (prefill chunk)")
    ap.add_argument("--quick", action="store_true", help="a 2k-token sequence (the test's run)")
    args = ap.parse_args()
    if args.quick:
        args.tokens, args.output = 2048, 64
    # "radix": the same model in one pool (today's layout); "swa_radix": the window pool
    plain, swa = (run(c, args.tokens, args.output, args.page_size, args.chunk) for c in CACHES)
    mib = 1 << 20
    print(
        f"Gemma-3-270M layout, {args.tokens}-token sequence ({args.output} decoded), "
        f"page {args.page_size}, chunk {args.chunk}, bfloat16"
    )
    print(f"{'pool':>13} {'held at end':>12} {'peak':>11} {'cached after':>13}")
    for r in (plain, swa):
        print(
            f"{r['pool']:>13} {r['bytes_at_end'] / mib:>9.2f}MiB {r['peak_bytes'] / mib:>8.2f}MiB "
            f"{r['cached_after_bytes'] / mib:>10.2f}MiB"
        )
    print(
        f"held at end: {plain['bytes_at_end'] / swa['bytes_at_end']:.2f}x less, "
        f"peak: {plain['peak_bytes'] / swa['peak_bytes']:.2f}x less, cached after it "
        f"finished: {plain['cached_after_bytes'] / swa['cached_after_bytes']:.2f}x less "
        f"(window pages held at end: {swa['window_pages_held']} of {swa['full_pages']})"
    )


CACHES = ("radix", "swa_radix")

if __name__ == "__main__":
    main()
