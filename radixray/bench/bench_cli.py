"""``radixray bench run | compare``: the live serving benchmark.

``run`` replays one workload against one OpenAI-compatible endpoint (any server). ``compare``
starts ``--workers`` fresh ``radixray worker`` processes per target and puts each router in front
of them in turn (see ``radixray.bench.compare``). Defaults are the settings of the published
table in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
from pathlib import Path

from .compare import DEFAULT_TARGETS, CompareConfig, run_compare
from .counters import SETTLE_S, counter_delta, worker_counters
from .loadgen import LoadConfig, run_load
from .local_cluster import WorkerSpec
from .report import breakdown_table, markdown_table, median_table, summarize, tier_table, write_json
from .workloads import WORKLOADS, build_workload

__all__ = ["main"]


def _workload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workloads")
    g.add_argument("--mooncake-requests", type=int, default=300)
    g.add_argument(
        "--block-tokens",
        type=int,
        default=16,
        help="tokens per Mooncake hash id (upstream 512: 16 is a 32x scale-down)",
    )
    g.add_argument(
        "--sample-every",
        type=int,
        default=10,
        help="keep one Mooncake conversation in N (whole conversations, trace order)",
    )
    g.add_argument("--mtbench-sessions", type=int, default=80)
    g.add_argument("--system-prompts", type=int, default=8)
    g.add_argument("--system-chars", type=int, default=2000)
    g.add_argument("--chat-max-tokens", type=int, default=32)


def _workload_kwargs(args, name: str) -> dict:
    if name == "mooncake":
        return {
            "limit": args.mooncake_requests,
            "block_tokens": args.block_tokens,
            "sample_every": args.sample_every,
        }
    return {
        "num_sessions": args.mtbench_sessions,
        "num_system": args.system_prompts,
        "system_chars": args.system_chars,
        "max_tokens": args.chat_max_tokens,
    }


def _cpus(text: str) -> tuple[int, ...]:
    """``0``, ``1,3`` or ``1-3`` -> the cores, each one this machine has."""
    cores: list[int] = []
    for part in text.split(","):
        lo, dash, hi = part.partition("-")
        if not (lo.isdigit() and (not dash or hi.isdigit())):
            raise argparse.ArgumentTypeError(f"expected cores like 0, 1,3 or 1-3, got {text!r}")
        cores += range(int(lo), int(hi if dash else lo) + 1)
    have = os.sched_getaffinity(0)
    if not cores or not set(cores) <= have:
        raise argparse.ArgumentTypeError(f"cores {text!r}: this process may use {sorted(have)}")
    return tuple(cores)


def _layout_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--router-cpus",
        type=_cpus,
        default=(),
        help="cores the router under test runs on, e.g. 0 (with --worker-cpus: a core of its "
        "own, as a deployment places it); default: any",
    )
    p.add_argument(
        "--worker-cpus",
        type=_cpus,
        default=(),
        help="cores the workers and the load generator run on, e.g. 1 or 1-3; default: any",
    )


def _load_args(p: argparse.ArgumentParser, prefix: str = "") -> None:
    g = p.add_argument_group("load")
    g.add_argument("--max-duration", type=float, default=240.0, help="seconds per run")
    g.add_argument("--max-requests", type=int, default=1000)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--no-progress", action="store_true")


def _cmd_run(args) -> int:
    wl = build_workload(args.workload, **_workload_kwargs(args, args.workload))
    load = LoadConfig(
        mode=args.mode,
        rate=args.rate,
        concurrency=args.concurrency,
        max_requests=args.max_requests,
        max_duration_s=args.max_duration,
        seed=args.seed,
        progress=not args.no_progress,
    )
    before = asyncio.run(worker_counters(args.worker_urls)) if args.worker_urls else None
    run = asyncio.run(run_load(args.url, wl, load, model=args.model, target=args.label))
    counters = None
    if before is not None:
        import time

        time.sleep(SETTLE_S)
        counters = counter_delta(before, asyncio.run(worker_counters(args.worker_urls)))
    row = summarize(run, counters) | {"router": args.label, "policy": "-"}
    print(markdown_table([row]))
    if args.out:
        write_json(
            args.out,
            {"summary": row, "meta": wl.meta, "requests": [r.as_dict() for r in run.requests]},
        )
    return 0 if row["ok"] else 1


def _cmd_compare(args, argv: list[str]) -> int:
    names = args.workloads
    common = {
        "max_requests": args.max_requests,
        "max_duration_s": args.max_duration,
        "seed": args.seed,
        "progress": not args.no_progress,
    }
    loads = {}
    for name in names:
        if name == "mooncake":  # open loop: arrivals at a fixed rate, as in the trace
            loads[name] = LoadConfig(mode="rate", rate=args.mooncake_rate, **common)
        else:  # chat users in a closed loop
            loads[name] = LoadConfig(
                mode="concurrency", concurrency=args.mtbench_concurrency, **common
            )
    cfg = CompareConfig(
        out_dir=Path(args.out_dir),
        workloads={n: _workload_kwargs(args, n) for n in names},
        loads=loads,
        targets=tuple(args.targets),
        num_workers=args.workers,
        worker=WorkerSpec(
            model=args.model,
            page_size=args.page_size,
            num_pages=args.num_pages,
            cpu_threads=args.cpu_threads,
            host_pages=args.host_pages,
            max_batch_tokens=args.max_batch_tokens,
        ),
        base_port=args.base_port,
        probe_requests=args.probe_requests,
        repeats=args.repeats,
        command="radixray bench " + shlex.join(argv),
        step_logs=args.step_logs,
        router_cpus=args.router_cpus,
        worker_cpus=args.worker_cpus,
    )
    report = run_compare(cfg)
    for name, w in report["workloads"].items():
        tables = (markdown_table, breakdown_table, tier_table, median_table)
        print(f"\n### {name}\n\n" + "\n".join(t(w["rows"]) for t in tables))
    print(f"wrote {args.out_dir}/bench_serving.json, .png and .md")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="radixray bench", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="replay one workload against one OpenAI-compatible endpoint")
    r.add_argument("--url", required=True, help="server root, e.g. http://127.0.0.1:8000")
    r.add_argument("--workload", choices=sorted(WORKLOADS), default="mooncake")
    r.add_argument("--model", default="tiny", help="the model name the server expects")
    r.add_argument("--label", default="endpoint")
    r.add_argument("--mode", choices=["rate", "concurrency"], default="rate")
    r.add_argument("--rate", type=float, default=4.0, help="sessions/s (mode rate)")
    r.add_argument("--concurrency", type=int, default=8)
    r.add_argument(
        "--worker-urls", nargs="*", default=None, help="radixray workers to read counters from"
    )
    r.add_argument("--out", default=None, help="write the JSON report here")
    _workload_args(r)
    _load_args(r)

    c = sub.add_parser("compare", help="radixray vs SGLang router on the same fresh workers")
    c.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS), default=sorted(WORKLOADS))
    c.add_argument(
        "--targets",
        nargs="+",
        default=list(DEFAULT_TARGETS),
        help="ROUTER:POLICY[@host-pages=N,num-pages=N]: e.g. radixray:ttft:tiers=false, "
        "radixray:ttft@host-pages=0 (the suffix changes that target's workers)",
    )
    c.add_argument("--workers", type=int, default=4)
    c.add_argument("--model", default="tiny")
    c.add_argument("--page-size", type=int, default=16)
    c.add_argument("--num-pages", type=int, default=768, help="KV pages per worker")
    c.add_argument("--cpu-threads", type=int, default=1)
    c.add_argument(
        "--max-batch-tokens",
        type=int,
        default=WorkerSpec.max_batch_tokens,
        help="tokens per engine step (a smaller budget chunks prefills: the workers saturate at "
        "a rate the router process still serves)",
    )
    c.add_argument(
        "--host-pages",
        type=int,
        default=None,
        help="host-tier KV pages per worker (unset: the engine's default, 0 on the CPU; a "
        "target's @host-pages=N overrides it)",
    )
    c.add_argument("--base-port", type=int, default=18100)
    c.add_argument("--mooncake-rate", type=float, default=4.0, help="requests/s")
    c.add_argument("--mtbench-concurrency", type=int, default=8, help="concurrent chat users")
    c.add_argument("--probe-requests", type=int, default=100)
    c.add_argument(
        "--repeats", type=int, default=2, help="runs per target, in alternating target order"
    )
    _layout_args(c)
    c.add_argument("--out-dir", default="/tmp/bench_serving")
    c.add_argument(
        "--step-logs",
        action="store_true",
        help="keep every worker's step log of each run in the JSON report (tokens and seconds "
        "of each engine step: where a fleet's time went)",
    )
    _workload_args(c)
    _load_args(c)

    args = parser.parse_args(argv)
    if args.cmd == "run":
        return _cmd_run(args)
    return _cmd_compare(args, argv)


if __name__ == "__main__":
    sys.exit(main())
