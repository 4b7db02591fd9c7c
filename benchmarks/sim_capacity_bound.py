"""How much of the excess over the bound is cache capacity: the bound again, with the cluster's
own cache size.

The issue's bound (``bound_p*``) gives every request the hits of an *infinite* cache on an idle
worker. When the cluster's caches hold a small part of what the trace reuses (Mooncake at its
real scale: 93.6M distinct tokens against 8 x 2,000 pages of 512 = 8.2M), part of every policy's
excess is capacity, which no routing removes. The *pooled* bound gives each request the hits of
one LRU radix cache (the worker's own ``RadixCache``) with all the cluster's pages, every earlier
request's full pages inserted when it arrives (nothing in flight, nothing locked): what a
cluster of this size could reuse if it were one worker. Each policy's excess is printed against
both, as the issue measures it (percentile of TTFT minus the same percentile of the bound), and
ttft's as a multiple of the best baseline's.

    .venv/bin/python benchmarks/sim_capacity_bound.py            # real scale and 8 x 8192 cpu
"""

from __future__ import annotations

import argparse
import sys

from radixray.cache_index import PageAllocator, RadixCache, hash_blocks
from radixray.numbers import percentile
from radixray.sim import SimConfig, load_mooncake, simulate, timing_preset
from radixray.sim.metrics import ceiling_hits

BASELINES = ("cache_aware", "cache_aware_smallest_cache", "kv_cost", "least_load")
CELLS = {
    # name: (block tokens = page size, workers, pages per worker, timing, speedup)
    "real-scale-gpu": (512, 8, 2000, "gpu", 1.0),
    "8x8192-cpu": (16, 8, 8192, "cpu", 2.5),
}


def pooled_hits(wl, page_size: int, num_pages: int) -> list[int]:
    """Each request's hit tokens in one LRU radix cache of ``num_pages`` pages that every earlier
    request's full pages (prompt, and a chat answer) went into, in arrival order; at most the
    first ``num_tokens - 1`` tokens, page-aligned, as a worker matches."""
    P = page_size
    alloc = PageAllocator(num_pages)
    cache = RadixCache(P, alloc, "lru", enable_events=False)
    hits = []
    for req in wl.requests:
        tokens = wl.tokens(req)
        m = cache.match_prefix(tokens)
        hits.append(min(m.num_tokens, (len(tokens) - 1) // P * P))
        seq = tokens + wl.output_tokens(req)
        k = len(seq) // P
        need = k - len(m.pages)
        if need <= 0:
            continue
        if need > num_pages:
            continue  # larger than the whole cache: never kept
        cache.lock(m.node)
        if alloc.num_free < need:
            cache.evict(need - alloc.num_free)
        cache.unlock(m.node)
        new = alloc.alloc(need)
        if new is None:  # what is left is held by the prefix itself
            continue
        kept = cache.insert(seq[: k * P], m.pages + new, None, hash_blocks(seq[: k * P], P))
        dup = new[: max(0, kept // P - len(m.pages))]  # cached meanwhile: never, here
        if dup:
            alloc.free(dup)
    cache.check_integrity()
    return hits


def idle_prefill(timing, n: int, hit: int) -> float:
    pos, t = hit, 0.0
    while pos < n:
        c = min(n - pos, timing.max_batch_tokens)
        t += timing.step_time(0, 0, c, c * pos + c * (c - 1) // 2)
        pos += c
    return t


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cells", default=",".join(CELLS), help=f"some of: {', '.join(CELLS)}")
    args = p.parse_args(argv)
    for name in args.cells.split(","):
        bt, workers, pages, timing_name, speedup = CELLS[name]
        timing = timing_preset(timing_name)
        wl = load_mooncake("mooncake", block_tokens=bt, speedup=speedup, seed=0)
        hits = pooled_hits(wl, bt, workers * pages)
        infinite = ceiling_hits(wl, bt)
        assert all(h <= c for h, c in zip(hits, infinite, strict=True)), "above the ceiling"
        prompt = sum(r.num_tokens for r in wl.requests)
        pooled = [
            idle_prefill(timing, r.num_tokens, h) for r, h in zip(wl.requests, hits, strict=True)
        ]
        bound_pooled = {q: percentile(pooled, q) for q in (50, 99)}
        cfg = SimConfig(
            num_workers=workers,
            num_pages=pages,
            page_size=bt,
            timing=timing,
            event_delay_s=0.05,
            seed=0,
        )
        rows = {}
        for pol in (*BASELINES, "ttft"):
            s = simulate(wl, pol, cfg).summary()
            for q in (50, 99):
                s[f"pooled_excess_p{q}"] = max(0.0, s[f"ttft_p{q}"] - bound_pooled[q])
            rows[pol] = s
        print(
            f"\n#### {name}: {workers} workers x {pages} pages of {bt} ({timing_name} timing, "
            f"speedup {speedup:g}); hit rate: infinite cache {rows['ttft']['ceiling']:.3f}, one "
            f"pooled cache of the cluster's pages {sum(hits) / prompt:.3f}\n"
        )
        print(
            "| policy | hit | TTFT p50 s | p99 s | excess over the bound p50 | p99 | "
            "excess over the pooled-cache bound p50 | p99 |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for pol, s in rows.items():
            print(
                f"| {pol} | {s['hit_rate']:.3f} | {s['ttft_p50']:.3f} | {s['ttft_p99']:.2f} | "
                f"{s['excess_p50']:.3f} | {s['excess_p99']:.3f} | {s['pooled_excess_p50']:.3f} | "
                f"{s['pooled_excess_p99']:.3f} |"
            )
        b50, b99 = bound_pooled[50], bound_pooled[99]
        print(
            f"| *bound* (infinite cache) | {rows['ttft']['ceiling']:.3f} | "
            f"{rows['ttft']['bound_p50']:.3f} | {rows['ttft']['bound_p99']:.2f} | | | | |"
        )
        print(
            f"| *pooled-cache bound* | {sum(hits) / prompt:.3f} | {b50:.3f} | {b99:.2f} | | | | |"
        )
        for key in ("excess_p50", "excess_p99", "pooled_excess_p50", "pooled_excess_p99"):
            best = min(BASELINES, key=lambda k, key=key: rows[k][key])
            ratio = rows["ttft"][key] / rows[best][key] if rows[best][key] > 0 else float("inf")
            print(f"ttft {key}: x{ratio:.2f} of the best baseline's ({best})")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
