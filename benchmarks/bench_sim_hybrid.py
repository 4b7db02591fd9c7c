"""Hybrid models in the routing simulator (issue 45): the state cache (mamba_radix) against no
reuse and against checkpoints only at request ends, the checkpoint-aware router index against a
checkpoint-blind one, and a sweep of ``state_interval`` against state memory at the same total
memory.

A Granite-4.0-H-Small-like cluster (radixray/sim/hybrid.py: 4 attention layers, 16 KiB of KV a
token; 36 Mamba2 layers, a state slot of 145.7 MiB, the KV of 9,327 tokens; a timing model
scaled from the ``gpu`` preset). Every worker has the same memory (``--memory-gib``) for KV
pages and state slots together: ``--state-gib`` of it buys state slots (each running request
holds one, checkpoints keep the rest), the KV pool gets the rest. Rows:

- ``mamba_radix`` at an interval of N pages: the engine's state cache, checkpoints at page ends
  that are multiples of N pages and at each prompt's last full page, in the worker's own slots;
- ``request ends``: the same with checkpoints only at each prompt's last full page;
- ``chunk``: no reuse, a slot per running request (its memory: the engine's default for chunk).

The router (``ttft``) reads an index fed by the workers' KV events: checkpoint-aware (it cuts
a worker's match at its deepest checkpoint) or checkpoint-blind (``index_states=False``: KV
blocks only, as Dynamo's). Each row: hit rate, TTFT p50 / p99, checkpoints saved and restored
per request, and the predicted tokens the worker did not deliver.

    .venv/bin/python benchmarks/bench_sim_hybrid.py --jobs 2   # Mooncake, 512-token pages, ~25 min
    .venv/bin/python benchmarks/bench_sim_hybrid.py --quick    # a smoke run (seconds)
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import date

from radixray.sim import SimConfig, load_mooncake, multiturn_chat, simulate
from radixray.sim.hybrid import (
    LAYOUTS,
    REQUEST_ENDS,
    HybridPools,
    hybrid_pools,
    hybrid_timing,
    state_copy_seconds,
)

KEYS = ("hit_rate", "ttft_p50", "ttft_p99")
GIB = 1 << 30


def undelivered(records) -> float:
    """Share of the router's predicted cached tokens the worker did not deliver."""
    pred = [r for r in records if r.predicted_cached > 0 and r.cached >= 0]
    total = sum(r.predicted_cached for r in pred)
    return sum(max(0, r.predicted_cached - r.cached) for r in pred) / total if total else 0.0


def _label(interval: int | None, page_size: int) -> str:
    if interval is None:
        return "chunk"
    if interval == REQUEST_ENDS:
        return "request ends"
    return f"every {interval // page_size} page{'s' if interval > page_size else ''}"


def plan(args) -> list[dict]:
    """Each run: its section, interval (tokens; None: chunk; REQUEST_ENDS), state slots a
    worker, and whether the router's index is checkpoint-blind."""
    P = args.page_size
    runs = []
    if "modes" in args.sections:
        for interval in (P, REQUEST_ENDS, None):
            runs.append({"section": "modes", "interval": interval, "slots": args.default_slots})
    if "index" in args.sections:
        for pages in args.blind:
            runs.append({"section": "index", "interval": _interval(pages, P),
                         "slots": args.default_slots, "blind": True})  # fmt: skip
    if "sweep" in args.sections:
        done = {(r["interval"], r["slots"]) for r in runs if not r.get("blind")}
        for slots in args.sweep_slots:
            for pages in [*args.intervals, 0]:
                if (_interval(pages, P), slots) not in done:
                    runs.append({"section": "sweep", "interval": _interval(pages, P),
                                 "slots": slots})  # fmt: skip
    return runs


def _interval(pages: int, page_size: int) -> int:
    """An interval in pages as tokens (0: request ends)."""
    return pages * page_size if pages else REQUEST_ENDS


def _workload(args):
    if args.workload == "multiturn_chat":
        return multiturn_chat(num_requests=args.limit or 3000, seed=args.seed)
    return load_mooncake("mooncake", block_tokens=args.page_size, speedup=args.speedup,
                         limit=args.limit, seed=args.seed)  # fmt: skip


def run_one(args, run: dict) -> dict:
    layout = LAYOUTS[args.layout]
    timing = args.timing
    P = args.page_size
    chunk = run["interval"] is None
    # chunk: a slot per running request (the engine's state_slots default for cache=chunk),
    # within the row's slots
    slots = min(timing.max_running, run["slots"]) if chunk else run["slots"]
    pages, slots = hybrid_pools(layout, int(args.memory_gib * GIB), P, slots)
    pools = HybridPools(
        slots,
        run["interval"] or P,
        "chunk" if chunk else "mamba_radix",
        state_copy_seconds(layout, timing),
        index_states=not run.get("blind", False),
    )
    cfg = SimConfig(num_workers=args.workers, num_pages=pages, page_size=P, timing=timing,
                    prefill_order=args.prefill_order, seed=args.seed, hybrid=pools)  # fmt: skip
    t0 = time.perf_counter()
    wl = _workload(args)
    copies = [0]

    def count(_w, _start, _dt, batch) -> None:
        copies[0] += len(batch.state_copies)

    r = simulate(wl, args.policy, cfg, on_step=count)
    s = r.summary()
    row = {**run, "label": _label(run["interval"], P), "pages": pages, "slots": slots}
    row["slot_gib"] = slots * layout.state_bytes / GIB
    row.update({k: s[k] for k in KEYS})
    row["undelivered"] = undelivered(r.records)
    row["copies_per_req"] = copies[0] / max(1, len(r.records))
    row["wall_s"] = time.perf_counter() - t0
    print(f"{row['section']:>6} {row['label']:>13} {slots:>4} slots {pages:>6} pages "
          f"{'blind' if run.get('blind') else 'aware'} hit {row['hit_rate']:.3f} "
          f"ttft {row['ttft_p50']:.3f}/{row['ttft_p99']:.3f} undelivered "
          f"{row['undelivered']:.4f} ({row['wall_s']:.0f} s)",
          file=sys.stderr, flush=True)  # fmt: skip
    return row


def run_all(args) -> list[dict]:
    runs = plan(args)
    print(f"{len(runs)} runs, {args.jobs} at a time", file=sys.stderr, flush=True)
    # the finest intervals first (the slowest: a commit and a checkpoint every few pages)
    order = sorted(range(len(runs)), key=lambda k: runs[k]["interval"] or REQUEST_ENDS)
    if args.jobs <= 1:
        done = [run_one(args, runs[k]) for k in order]
    else:
        with ProcessPoolExecutor(args.jobs) as ex:
            done = list(ex.map(run_one, [args] * len(runs), [runs[k] for k in order]))
    rows = [None] * len(runs)
    for k, row in zip(order, done, strict=True):
        rows[k] = row
    return rows


def table(rows: list[dict], section: str) -> str:
    lines = [
        "| checkpoints | state GiB (slots) | KV pages | router index | hit | TTFT p50 s "
        "| TTFT p99 s | state copies / request | predicted tokens not delivered |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r["section"] != section and not (section == "sweep" and r["section"] == "modes"):
            continue
        index = "blind" if r.get("blind") else "aware"
        lines.append(
            f"| {r['label']} | {r['slot_gib']:.1f} ({r['slots']}) | {r['pages']} | {index} "
            f"| {r['hit_rate']:.3f} | {r['ttft_p50']:.3f} | {r['ttft_p99']:.3f} "
            f"| {r['copies_per_req']:.1f} | {r['undelivered']:.4f} |"
        )
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="multiturn_chat, 120 requests, small pools")
    p.add_argument("--workload", choices=("mooncake", "multiturn_chat"), default="mooncake")
    p.add_argument("--limit", type=int, default=None, help="only the first N requests")
    p.add_argument("--layout", choices=sorted(LAYOUTS), default="granite-4.0-h")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument(
        "--memory-gib",
        type=float,
        default=60.0,
        help="KV + state memory per worker (default 60 GiB: a 141 GB GPU less Granite-4.0-H-"
        "Small's 64 GB of bf16 weights, the engine's 85%% share of the rest, rounded down)",
    )
    p.add_argument("--default-slots", type=int, default=128,
                   help="state slots a worker in the modes and index rows (default: the "
                   "engine's, 2x max_running; 18.2 GiB of Granite-4.0-H-Small's)")  # fmt: skip
    p.add_argument("--sweep-slots", type=_ints, default=[64, 128, 256],
                   help="state slots a worker the sweep runs")  # fmt: skip
    p.add_argument("--intervals", type=_ints, default=[1, 4, 16],
                   help="intervals the sweep runs, in pages (request ends always)")  # fmt: skip
    p.add_argument("--blind", type=_ints, default=[1, 0],
                   help="intervals (pages; 0: request ends) of the blind index's rows")  # fmt: skip
    p.add_argument("--sections", default="modes,index,sweep")
    p.add_argument("--page-size", type=int, default=512)
    p.add_argument("--speedup", type=float, default=1.0, help="arrivals this much faster")
    p.add_argument("--policy", default="ttft")
    p.add_argument("--prefill-order", default="ratio")
    p.add_argument("--jobs", type=int, default=1, help="runs at once (processes)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the rows as JSON here")
    args = p.parse_args(argv)
    layout = LAYOUTS[args.layout]
    args.timing = hybrid_timing(layout)
    if args.quick:
        args.workload, args.workers, args.page_size = "multiturn_chat", 2, 16
        args.timing = args.timing.with_(max_batch_tokens=512, max_running=16)
        args.memory_gib, args.default_slots, args.sweep_slots = 4.0, 16, [8]
        args.intervals, args.blind, args.limit = [1], [0], 120
    rows = run_all(args)
    print(f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, "
          f"{date.today()}; {args.workload}, {args.workers} workers x {args.memory_gib} GiB of "
          f"KV + state, {layout.name}-like, {args.page_size}-token pages, {args.policy}, "
          f"{args.prefill_order} prefills, speedup {args.speedup}, seed {args.seed}")  # fmt: skip
    for section in ("modes", "index", "sweep"):
        if section in args.sections:
            print(f"\n{section}\n{table(rows, section)}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": {**vars(args), "timing": args.timing.to_dict()}, "rows": rows},
                      f, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
