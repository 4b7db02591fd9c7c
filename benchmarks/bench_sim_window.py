"""Sliding-window models in the routing simulator (issue 25): window-aware pools against plain
pools at the same memory, and window-aware routing against a window-blind router.

A Gemma-3-12B-like cluster (radixray/sim/window.py: 40 window layers of 1,024 tokens and 8
global ones, 64 KiB of full-attention KV and 320 KiB of window KV a token in bfloat16; a timing
model scaled from the ``gpu`` preset). Every worker has the same KV memory (``--kv-gib``):

- ``plain``: one pool that keeps every layer's pages (384 KiB a token), the engine's RadixCache;
- ``window``: the engine's window pool and ``swa_radix`` cache, sized from the same memory as
  the engine sizes it (0.25 window pages per full page), window pages trimmed out of every
  running request's window and evicted first.

On the window pools the router's index is window-aware (KV events of both groups: it predicts
only the reusable prefix) or window-blind (``ApproxIndex(windows=False)``: full-attention
blocks only, as Dynamo indexes today). Each row: hit rate, TTFT p50 / p99, excess over the
infinite-cache bound p50 / p99, and the predictions the worker could not deliver: the share of
requests with a predicted hit that got less than predicted, and the share of predicted tokens
not delivered.

    .venv/bin/python benchmarks/bench_sim_window.py          # Mooncake, 512-token pages
    .venv/bin/python benchmarks/bench_sim_window.py --quick  # a smoke run (seconds)
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import replace
from datetime import date

from radixray.sim import SimConfig, load_mooncake, multiturn_chat, simulate
from radixray.sim.window import GEMMA3_12B, gemma3_12b_timing, plain_pages, pool_pages

KEYS = ("hit_rate", "ttft_p50", "ttft_p99", "excess_p50", "excess_p99")


def mispredicted(records) -> tuple[float, float]:
    """(share of the requests with a predicted hit that got fewer cached tokens than predicted,
    share of the predicted tokens not delivered)."""
    pred = [r for r in records if r.predicted_cached > 0 and r.cached >= 0]
    if not pred:
        return 0.0, 0.0
    short = sum(r.cached < r.predicted_cached for r in pred)
    missing = sum(max(0, r.predicted_cached - r.cached) for r in pred)
    return short / len(pred), missing / sum(r.predicted_cached for r in pred)


def runs(args, model) -> list[tuple[str, str, dict]]:
    """(pools label, index label, SimConfig fields) of each run."""
    budget = int(args.kv_gib * (1 << 30))
    P = args.page_size
    plain = plain_pages(model, budget, P)
    full, win = pool_pages(model, budget, P, args.timing.max_batch_tokens, args.window_share)
    windowed = {"num_pages": full, "window": model.window, "window_pages": win}
    rows = {
        "plain": (f"plain {plain}", "-", {"num_pages": plain}),
        "aware": (f"window {full} + {win}", "window-aware", windowed),
        "blind": (f"window {full} + {win}", "window-blind", {**windowed, "window_index": False}),
    }
    return [rows[k] for k in args.rows.split(",")]


def run_all(args, model) -> list[dict]:
    if args.workload == "multiturn_chat":
        wl = multiturn_chat(num_requests=args.limit or 3000, seed=args.seed)
    else:
        wl = load_mooncake(
            "mooncake", block_tokens=args.page_size, speedup=args.speedup, seed=args.seed
        )
    rows = []
    for policy in args.policies.split(","):
        for pools, index, fields in runs(args, model):
            cfg = SimConfig(
                num_workers=args.workers,
                page_size=args.page_size,
                timing=args.timing,
                prefill_order=args.prefill_order,
                seed=args.seed,
                **fields,
            )
            t0 = time.perf_counter()
            r = simulate(wl, policy, cfg)
            s = r.summary()
            short, missing = mispredicted(r.records)
            row = {"pools": pools, "index": index, "policy": policy, **{k: s[k] for k in KEYS}}
            row.update(short=short, missing=missing, oversize=r.oversize)
            row["wall_s"] = time.perf_counter() - t0
            rows.append(row)
            print(f"{pools:>20} {index:<13} {policy:<12} hit {row['hit_rate']:.3f} "
                  f"ttft {row['ttft_p50']:.3f}/{row['ttft_p99']:.3f} short {short:.3f} "
                  f"({row['wall_s']:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| pools (full + window pages/worker) | router index | policy | hit | TTFT p50 s "
        "| TTFT p99 s | excess p50 s | excess p99 s | predicted hits short | predicted tokens "
        "not delivered |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['pools']} | {r['index']} | {r['policy']} | {r['hit_rate']:.3f} "
            f"| {r['ttft_p50']:.3f} | {r['ttft_p99']:.3f} | {r['excess_p50']:.3f} "
            f"| {r['excess_p99']:.3f} | {r['short']:.3f} | {r['missing']:.3f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="multiturn_chat, 400 requests, small pools")
    p.add_argument("--workload", choices=("mooncake", "multiturn_chat"), default="mooncake")
    p.add_argument("--limit", type=int, default=None, help="requests of a generated workload")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument(
        "--kv-gib",
        type=float,
        default=90.0,
        help="KV memory per worker (default 90 GiB: a 141 GB GPU less 24 GB of weights, the "
        "engine's 85%% share of the rest, rounded down)",
    )
    p.add_argument("--page-size", type=int, default=512)
    p.add_argument("--speedup", type=float, default=1.0, help="arrivals this much faster")
    p.add_argument("--window", type=int, default=None, help="override the model's window")
    p.add_argument("--window-share", type=float, default=0.25, help="window pages per full page")
    p.add_argument("--policies", default="ttft", help="comma-separated")
    p.add_argument("--rows", default="plain,aware,blind", help="which pools and indexes to run")
    p.add_argument("--prefill-order", default="shortest")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the rows as JSON here")
    args = p.parse_args(argv)
    if args.quick:
        args.workers, args.kv_gib, args.page_size, args.window = 4, 0.4, 16, 128
        args.workload, args.limit = "multiturn_chat", 400
    model = GEMMA3_12B if args.window is None else replace(GEMMA3_12B, window=args.window)
    args.timing = gemma3_12b_timing()
    rows = run_all(args, model)
    print(f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, "
          f"{date.today()}; {args.workload}, {args.workers} workers x {args.kv_gib} GiB of KV, "
          f"{model.name}-like (window {model.window}), {args.page_size}-token pages, "
          f"{args.prefill_order} prefills, speedup {args.speedup}, seed {args.seed}")  # fmt: skip
    print(table(rows))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": {**vars(args), "timing": args.timing.to_dict()}, "rows": rows},
                      f, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
