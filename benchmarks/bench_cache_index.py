"""Benchmark of the cache index: RadixCache.match_prefix / insert and ApproxIndex.match.

    .venv/bin/python benchmarks/bench_cache_index.py            # full size (a few minutes)
    .venv/bin/python benchmarks/bench_cache_index.py --quick    # small smoke run

What is built (P = 16, 4,096-token prompts = 256 pages):

RadixCache: 10,000 prompts in ``--groups`` (100) groups. Each prompt is

    [ system prompt: 1,024 tokens, one per group              ]   shared by 100 prompts
    [ document / few-shot context: 1,024 tokens, 10 per group ]   shared by 10 prompts
    [ user turn: 2,048 tokens, unique                         ]

so the tree has 100 system nodes, 1,000 context nodes and 10,000 leaves (1.35M cached pages).
Tokens are drawn from a 32k vocabulary. Every query and insert is a fresh list of fresh int
objects, as token ids arrive from a tokenizer (HF tokenizers builds new ints) or off the wire:
comparing them with the cached keys then compares values, not object identity (which would be
~3x cheaper and is not what a server sees). Timed operations (one call each,
``time.perf_counter_ns``):

- match_prefix (full hit): a cached prompt, all 4,096 tokens match.
- match_prefix (partial hit): a new prompt, system + context (2,048 tokens) match.
- insert (new prompt): system + context cached, 2,048 new tokens = 128 new pages (hashed).
- insert (cached prompt): a finished request whose prompt is fully cached already.

ApproxIndex: 16 workers, 1,000,000 (block, worker) entries. Block chains are built like the
prompts above (64-block system prefix shared by a group, 64-block context, 128-block unique
tail); each prompt goes to one worker, or two with probability 0.25, until every worker holds
62,500 entries. Queries are 256-block chains: a held prompt (all workers that hold it match 256),
a new prompt sharing a group prefix (up to a 128-block hit) and a cold prompt, in equal parts.
Memory is measured twice: ``memory_bytes()`` and, independently, tracemalloc's count of bytes
still allocated after the build once everything but the index is dropped.

The garbage collector is collected and frozen after each build (``gc.freeze()``), as a long-lived
server would do after start-up, so a full-heap collection does not land in the timed calls.
"""

from __future__ import annotations

import argparse
import gc
import platform
import random
import statistics
import sys
import time
import tracemalloc
from array import array
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from radixray.cache_index import ApproxIndex, PageAllocator, RadixCache, hash_blocks  # noqa: E402

P = 16
VOCAB = list(range(32000))


def pct(xs_ns: list[int], q: float) -> float:
    xs = sorted(xs_ns)
    return xs[min(len(xs) - 1, int(q * len(xs)))] / 1000.0


def summary(name: str, xs_ns: list[int], target: str) -> dict:
    return {
        "op": name,
        "n": len(xs_ns),
        "median_us": statistics.median(xs_ns) / 1000.0,
        "p99_us": pct(xs_ns, 0.99),
        "target": target,
    }


def rand_tokens(rng: random.Random, n: int) -> list[int]:
    return [VOCAB[i] for i in rng.choices(range(len(VOCAB)), k=n)]


def fresh(tokens: list[int]) -> list[int]:
    """The same values in new int objects (ids <= 256 stay Python's cached small ints)."""
    return array("q", tokens).tolist()


# ---------------------------------------------------------------------------- RadixCache


class PromptSet:
    """system (1/group) + context (per group) + unique tail, as described in the docstring."""

    def __init__(self, rng, groups, contexts, users, sys_len, ctx_len, tail_len):
        self.rng = rng
        self.tail_len = tail_len
        self.systems = [rand_tokens(rng, sys_len) for _ in range(groups)]
        self.contexts = [
            [rand_tokens(rng, ctx_len) for _ in range(contexts)] for _ in range(groups)
        ]
        self.users = users

    def base(self, g, c):
        return self.systems[g] + self.contexts[g][c]

    def new_prompt(self, g, c):
        return self.base(g, c) + rand_tokens(self.rng, self.tail_len)


def bench_radix(args) -> list[dict]:
    rng = random.Random(0)
    prompt_len = 4096
    sys_len, ctx_len = 1024, 1024
    tail_len = prompt_len - sys_len - ctx_len
    ps = PromptSet(rng, args.groups, args.contexts, args.users, sys_len, ctx_len, tail_len)
    n_prompts = args.groups * args.contexts * args.users
    n_new = args.inserts
    num_pages = n_prompts * (prompt_len // P) + (n_new + 16) * (prompt_len // P)
    alloc = PageAllocator(num_pages)
    cache = RadixCache(P, alloc, eviction="lru")

    prompts: list[list[int]] = []
    t0 = time.perf_counter()
    with tqdm(total=n_prompts, desc="build radix tree", unit="prompt") as bar:
        for g in range(args.groups):
            for c in range(args.contexts):
                for _ in range(args.users):
                    toks = ps.new_prompt(g, c)
                    pages = alloc.alloc(prompt_len // P)
                    cached = cache.insert(toks, pages)
                    alloc.free(pages[: cached // P])
                    prompts.append(toks)
                    bar.update()
    build_s = time.perf_counter() - t0
    gc.collect()
    gc.freeze()
    print(
        f"tree: {n_prompts} prompts, {cache.total_pages:,} cached pages, "
        f"{sum(1 for _ in cache._tree.iter_nodes()):,} nodes, built in {build_s:.1f} s"
    )
    cache.check_integrity()

    results = []
    perf = time.perf_counter_ns

    # match_prefix, full hit: cached prompts in random order.
    full = []
    for _ in tqdm(range(args.matches), desc="match_prefix full hit"):
        q = fresh(prompts[rng.randrange(len(prompts))])
        t = perf()
        r = cache.match_prefix(q)
        full.append(perf() - t)
        assert r.num_tokens == prompt_len
    results.append(
        summary("RadixCache.match_prefix, 4096-token prompt, full hit", full, "median <= 50 us")
    )

    # match_prefix, partial hit: new prompts of known groups (system + context match).
    queries = [
        fresh(ps.new_prompt(rng.randrange(args.groups), rng.randrange(args.contexts)))
        for _ in range(min(args.matches, 2000))
    ]
    part = []
    for q in tqdm(queries * (args.matches // len(queries)), desc="match_prefix partial hit"):
        t = perf()
        r = cache.match_prefix(q)
        part.append(perf() - t)
        assert r.num_tokens == sys_len + ctx_len
    results.append(
        summary("RadixCache.match_prefix, 4096-token prompt, 2048 cached", part, "median <= 50 us")
    )

    # insert of new prompts (128 new pages to hash and adopt each).
    ins = []
    for _ in tqdm(range(n_new), desc="insert new prompt"):
        toks = fresh(ps.new_prompt(rng.randrange(args.groups), rng.randrange(args.contexts)))
        pages = alloc.alloc(prompt_len // P)
        t = perf()
        cached = cache.insert(toks, pages)
        ins.append(perf() - t)
        assert cached == sys_len + ctx_len
        alloc.free(pages[: cached // P])
    results.append(
        summary("RadixCache.insert, 4096-token prompt, 2048 new tokens", ins, "median <= 100 us")
    )

    # The same, called as the engine calls it: with the block hashes the request computed on
    # arrival (for routing, dedupe and events), so the cache does not hash its pages again.
    ins_h = []
    for _ in tqdm(range(n_new), desc="insert new prompt, hashes known"):
        toks = fresh(ps.new_prompt(rng.randrange(args.groups), rng.randrange(args.contexts)))
        hashes = hash_blocks(toks, P)
        pages = alloc.alloc(prompt_len // P)
        t = perf()
        cached = cache.insert(toks, pages, block_hashes=hashes)
        ins_h.append(perf() - t)
        assert cached == sys_len + ctx_len
        alloc.free(pages[: cached // P])
    results.append(summary("... the same with the request's block hashes (engine path)", ins_h, ""))

    # insert of a prompt that is fully cached (a request that matched everything).
    dup = []
    spare = alloc.alloc(prompt_len // P)
    for _ in tqdm(range(n_new), desc="insert cached prompt"):
        q = fresh(prompts[rng.randrange(len(prompts))])
        t = perf()
        cached = cache.insert(q, spare)
        dup.append(perf() - t)
        assert cached == prompt_len
    alloc.free(spare)
    results.append(
        summary("RadixCache.insert, 4096-token prompt, all cached", dup, "median <= 100 us")
    )
    cache.check_integrity()
    del cache, prompts, ps
    gc.unfreeze()
    gc.collect()
    return results


# ---------------------------------------------------------------------------- ApproxIndex


def bench_index(args) -> tuple[list[dict], dict]:
    rng = random.Random(1)
    workers = 16
    entries_per_worker = args.index_entries // workers
    groups, contexts = 200, 10

    def rand_hashes(r: random.Random, n: int) -> list[int]:
        return [r.getrandbits(64) for _ in range(n)]

    # Prompts are (group, context, tail seed): a chain can be rebuilt after the memory count.
    pools = {
        "sys": [rand_hashes(rng, 64) for _ in range(groups)],
        "ctx": [[rand_hashes(rng, 64) for _ in range(contexts)] for _ in range(groups)],
    }

    def chain(g: int, c: int, seed: int) -> list[int]:
        return pools["sys"][g] + pools["ctx"][g][c] + rand_hashes(random.Random(seed), 128)

    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    idx = ApproxIndex(P, max_blocks_per_worker=entries_per_worker)
    held: list[tuple[int, int, int]] = []
    t0 = time.perf_counter()
    with tqdm(total=workers * entries_per_worker, desc="build index", unit="entry") as bar:
        while True:
            short = [w for w in range(workers) if idx.num_blocks(w) < entries_per_worker]
            if not short:
                break
            spec = (rng.randrange(groups), rng.randrange(contexts), rng.getrandbits(48))
            owners = [rng.choice(short)]
            if rng.random() < 0.25:
                owners.append(rng.randrange(workers))
            before = idx.num_blocks()
            h = chain(*spec)
            for w in owners:
                idx.insert(w, h)
            held.append(spec)
            bar.update(idx.num_blocks() - before)
    build_s = time.perf_counter() - t0
    # Independent memory count: drop the hash pools (the index keeps alive the ints it holds),
    # then ask tracemalloc what is still allocated since the baseline. `held` (a few thousand
    # small tuples) is subtracted as measured by getsizeof.
    del h
    pools_backup = pools.copy()
    pools.clear()
    gc.collect()
    held_bytes = sys.getsizeof(held) + sum(
        sys.getsizeof(t) + sum(sys.getsizeof(x) for x in t) for t in held
    )
    traced = tracemalloc.get_traced_memory()[0] - base - held_bytes
    tracemalloc.stop()
    pools.update(pools_backup)
    del pools_backup
    entries = idx.num_blocks()
    mem = {
        "entries": entries,
        "distinct_blocks": idx.num_distinct_blocks(),
        "memory_bytes": idx.memory_bytes(),
        "traced_bytes": traced,
        "build_s": build_s,
    }
    print(
        f"index: {workers} workers, {entries:,} (block, worker) entries, "
        f"{idx.num_distinct_blocks():,} distinct blocks, built in {build_s:.1f} s"
    )
    print(
        f"memory: memory_bytes() {mem['memory_bytes'] / entries:.0f} B/entry, "
        f"tracemalloc {traced / entries:.0f} B/entry"
    )
    # Queries: held prompts, new prompts of known groups, cold prompts (in equal parts).
    queries = []
    for i in range(args.index_queries):
        kind = i % 3
        if kind == 0:
            queries.append(chain(*held[rng.randrange(len(held))]))
        elif kind == 1:
            queries.append(chain(rng.randrange(groups), rng.randrange(contexts), rng.random()))
        else:
            queries.append(rand_hashes(rng, 256))
    gc.collect()
    gc.freeze()
    perf = time.perf_counter_ns
    times = []
    for _ in range(args.index_rounds):
        for q in tqdm(queries, desc="ApproxIndex.match", leave=False):
            t = perf()
            idx.match(q)
            times.append(perf() - t)
    gc.unfreeze()
    res = [
        summary(
            "ApproxIndex.match, 16 workers, 1M entries, 256-block query", times, "p99 <= 100 us"
        )
    ]
    by_kind = [times[i::3] for i in range(3)]
    for name, xs in zip(["held prompt", "new prompt, shared prefix", "cold"], by_kind, strict=True):
        res.append(summary(f"  ... {name} queries", xs, ""))
    return res, mem


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--groups", type=int, default=100)
    ap.add_argument("--contexts", type=int, default=10)
    ap.add_argument("--users", type=int, default=10)
    ap.add_argument("--matches", type=int, default=20000)
    ap.add_argument("--inserts", type=int, default=2000)
    ap.add_argument("--index-entries", type=int, default=1_000_000)
    ap.add_argument("--index-queries", type=int, default=6000)
    ap.add_argument("--index-rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    args = ap.parse_args()
    if args.quick:
        args.groups, args.contexts, args.users = 4, 3, 3
        args.matches, args.inserts = 500, 200
        args.index_entries, args.index_queries, args.index_rounds = 32_000, 600, 1

    print(f"python {platform.python_version()} on {platform.processor() or platform.machine()}")
    t0 = time.perf_counter()
    rows = bench_radix(args)
    idx_rows, mem = bench_index(args)
    rows += idx_rows
    print()
    print("| operation | n | median (us) | p99 (us) | target |")
    print("|---|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['op']} | {r['n']} | {r['median_us']:.1f} | {r['p99_us']:.1f} | {r['target']} |"
        )
    per = mem["entries"]
    print(
        f"| ApproxIndex memory per (block, worker) entry | {per} | "
        f"memory_bytes() {mem['memory_bytes'] / per:.0f} B | "
        f"tracemalloc {mem['traced_bytes'] / per:.0f} B | <= 256 B |"
    )
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
