"""``python -m radixray.sim`` (later ``radixray sim``): run policies over a workload, print a
table, optionally write ``--json`` and ``--plot``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from radixray.cache_index.radix_tree import EVICTION_POLICIES
from radixray.router.policies import make_policy, policy_names
from radixray.router.policies.ttft_config import TTFTConfig, with_settings
from radixray.settings import add_arguments, from_args
from radixray.worker.scheduler import PACKINGS, PREFILL_ORDERS, SchedulerConfig

from .generators import azure_shared_prefix, hot_prefix, multiturn_chat
from .hybrid import LAYOUTS, HybridPools, hybrid_timing, state_copy_seconds
from .results import SUMMARY_KEYS, RunResult
from .simulator import SimConfig, simulate
from .timing import DEFAULT_TIMING, TIMING_PRESETS, load_timing
from .workload import Workload, load_mooncake

__all__ = ["main", "build_parser", "build_workload", "format_table", "JSON_KEYS"]

DEFAULT_POLICIES = "round_robin,cache_aware,kv_cost,ttft"
JSON_KEYS = (
    *SUMMARY_KEYS,
    "excess_p50",
    "excess_p90",
    "excess_p99",
    "pooled_excess_p50",
    "pooled_excess_p90",
    "pooled_excess_p99",
    "delay_p50",
    "delay_p90",
    "delay_p99",
    "delay_mean",
    "reuse_available",
    "reuse_captured",
    "reuse_over",
    "reuse_under",
    "index_memory_bytes",
)


def _admission_args(c) -> None:
    """The live router's admission limits, modelled (default: every request is served)."""
    c.add_argument(
        "--max-inflight",
        type=int,
        default=None,
        help="model the router's admission: refuse (429) arrivals while this many requests are "
        "in flight (default: serve every request)",
    )
    c.add_argument(
        "--max-inflight-per-worker",
        type=int,
        default=None,
        help="likewise, while every worker has this many requests (running + waiting)",
    )
    c.add_argument(
        "--max-queue-s",
        type=float,
        default=None,
        help="likewise, while the least-queued worker would make an arrival wait longer than "
        "this many seconds before its prefill (the router's max_queue_s)",
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="radixray sim",
        description="Trace-driven routing simulator: real policies, real RadixCache per worker, "
        "a timing model instead of a model.",
    )
    w = p.add_argument_group("workload")
    w.add_argument(
        "--trace",
        default="mooncake",
        help="a JSONL file (plain or .gz) in the Mooncake format, or 'mooncake' for the "
        "conversation trace shipped with the package ($RADIXRAY_DATA_DIR overrides)",
    )
    w.add_argument(
        "--workload",
        choices=("trace", "azure_shared_prefix", "multiturn_chat", "hot_prefix"),
        default="trace",
        help="'trace' replays --trace; the others are generated",
    )
    w.add_argument("--block-tokens", type=int, default=16, help="tokens per 512-token trace block")
    w.add_argument("--speedup", type=float, default=1.0, help="compress arrival times by this")
    w.add_argument("--output-scale", type=float, default=None, help="divide output lengths")
    w.add_argument("--limit", type=int, default=None, help="only the first N requests")
    c = p.add_argument_group("cluster")
    c.add_argument("--workers", type=int, default=SimConfig.num_workers)
    c.add_argument("--pages", type=int, default=SimConfig.num_pages, help="KV pages per worker")
    _add_tier_arguments(c)
    c.add_argument("--page-size", type=int, default=SimConfig.page_size)
    c.add_argument(
        "--timing",
        default=None,
        help=f"a preset ({', '.join(sorted(TIMING_PRESETS))}) or a JSON file fitted to a live "
        f"engine by `radixray sim calibrate --out FILE` (default: {DEFAULT_TIMING}; with "
        "--model-layout, the gpu preset scaled to that model)",
    )
    _add_hybrid_arguments(p.add_argument_group("hybrid model (docs/state_cache.md)"))
    c.add_argument("--eviction", choices=EVICTION_POLICIES, default=SimConfig.eviction)
    c.add_argument(
        "--prefill-order",
        choices=PREFILL_ORDERS,
        default=SimConfig.prefill_order,
        help="the workers' scheduler: running prefills first, or the fewest uncomputed tokens",
    )
    c.add_argument(
        "--packing",
        choices=PACKINGS,
        default=SimConfig.packing,
        help="a step that finishes a prompt takes more prefill only while it pays (priced), or "
        "every step is filled to its budget (full)",
    )
    c.add_argument(
        "--event-delay",
        type=float,
        default=SimConfig.event_delay_s,
        help="KV event delay to the router (s)",
    )
    _admission_args(c)
    c.add_argument("--no-events", action="store_true", help="index learns only from decisions")
    c.add_argument("--no-optimistic", action="store_true", help="index learns only from KV events")
    p.add_argument(
        "--policies",
        default=DEFAULT_POLICIES,
        help="comma-separated policies, each a name or a spec with arguments such as "
        f"'cache_aware_v03:fallback=smallest_cache'; or 'all' ({', '.join(policy_names())})",
    )
    add_arguments(p.add_argument_group("the ttft policy (TTFTConfig)"), TTFTConfig)
    p.add_argument("--seed", type=int, default=SimConfig.seed)
    p.add_argument("--json", dest="json_path", help="write {policy: {metric: value}} here")
    p.add_argument("--plot", dest="plot_path", help="write a PNG: hit rate, TTFT CDF, load")
    p.add_argument("--no-progress", action="store_true")
    return p


def _add_tier_arguments(c: argparse._ArgumentGroup) -> None:
    """The host tier's flags: its pages, and how the timing model prices its copies."""
    c.add_argument(
        "--host-pages",
        type=_pages,
        default=SimConfig.host_pages,
        help="host-tier pages per worker (0: none): device eviction demotes, admission loads "
        "back, the copies priced by the timing model (docs/host_tier.md)",
    )
    c.add_argument(
        "--overlap-layers",
        type=_layers,
        default=None,
        metavar="L",
        help="price a step's host-tier copies overlapped layer by layer with a forward of L "
        "layers; 0: in series, copies then forward (default: the timing model's; the gpu preset "
        "32, the cpu preset 0)",
    )


def _add_hybrid_arguments(h: argparse._ArgumentGroup) -> None:
    """A hybrid model's layout: every worker runs mamba_radix with a state pool."""
    h.add_argument(
        "--model-layout",
        choices=sorted(LAYOUTS),
        default=None,
        help="simulate a hybrid (state layers + attention layers, sim/hybrid.py): every worker "
        "runs the engine's mamba_radix cache, KV pages for the attention layers (--pages) and "
        "--state-slots state slots for running requests and checkpoints",
    )
    h.add_argument(
        "--state-interval",
        type=_positive,
        default=SchedulerConfig.state_interval,
        help="tokens between state checkpoints (taken at page ends that are multiples of it and "
        "at each prompt's last full page), as the engine's --state-interval",
    )
    h.add_argument(
        "--state-slots",
        type=_positive,
        default=None,
        help="state slots per worker (default: 2x the timing's max_running, the engine's "
        "default: a slot per running request and as many for checkpoints)",
    )


def _positive(text: str) -> int:
    """An int >= 1 (argparse names the flag when this refuses)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}")
    return int(text)


def _pages(text: str) -> int:
    """An int >= 0 (argparse names the flag when this refuses)."""
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be an int >= 0 (0: no host tier), got {text!r}")
    return n


def _layers(text: str) -> int:
    """An int >= 0 (argparse names the flag when this refuses)."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be an int >= 0 (0: in series), got {text!r}")
    return int(text)


def build_workload(args: argparse.Namespace) -> Workload:
    if args.workload == "azure_shared_prefix":
        return azure_shared_prefix(
            num_requests=args.limit or 2000, speedup=args.speedup, seed=args.seed
        )
    if args.workload == "multiturn_chat":
        return multiturn_chat(num_requests=args.limit or 2000, seed=args.seed)
    if args.workload == "hot_prefix":
        return hot_prefix(num_requests=args.limit or 3000, seed=args.seed)
    return load_mooncake(
        args.trace,
        block_tokens=args.block_tokens,
        speedup=args.speedup,
        output_scale=args.output_scale,
        limit=args.limit,
        seed=args.seed,
    )


def format_table(summaries: dict[str, dict]) -> str:
    """One row per policy; ``xs`` columns are its TTFT's excess over the bound at p50 / p99 (all
    that routing can remove), and the bound itself is the last line."""
    w = max([16, *(len(name) + 2 for name in summaries)])
    head = (
        f"{'policy':<{w}}{'hit':>7}{'avail':>7}{'capt':>7}{'hit>b0':>8}{'ceil':>7}"
        f"{'p50 s':>8}{'p90 s':>8}{'p99 s':>8}{'xs p50':>8}{'xs p99':>8}"
        f"{'req/s':>8}{'imbal':>7}{'index KB':>10}"
    )
    lines = [head, "-" * len(head)]
    for name, s in summaries.items():
        lines.append(
            f"{name:<{w}}{s['hit_rate']:>7.3f}{s['reuse_available']:>7.3f}"
            f"{s['reuse_captured']:>7.3f}{s['hit_rate_beyond_first_block']:>8.3f}"
            f"{s['ceiling']:>7.3f}{s['ttft_p50']:>8.2f}{s['ttft_p90']:>8.2f}{s['ttft_p99']:>8.2f}"
            f"{s['excess_p50']:>8.2f}{s['excess_p99']:>8.2f}"
            f"{s['throughput']:>8.2f}{s['imbalance']:>7.2f}{s['index_memory_bytes'] / 1024:>10.0f}"
        )
    refused = {k: s["refused"] for k, s in summaries.items() if s.get("refused")}
    if refused:
        lines.append(
            "refused by the admission limit (left out of every figure above): "
            + ", ".join(f"{k} {n}" for k, n in refused.items())
        )
    if summaries:
        s = next(iter(summaries.values()))
        lines.append(
            f"{'bound':<{w}}{'':>36}{s['bound_p50']:>8.2f}{s['bound_p90']:>8.2f}"
            f"{s['bound_p99']:>8.2f}   (whole infinite-cache prefix hit on an idle worker)"
        )
        if "pooled_ttft_p50" in s:
            lines.append(
                f"{'pooled cache':<{w}}{s['pooled_hit_rate']:>7.3f}{'':>29}"
                f"{s['pooled_ttft_p50']:>8.2f}{s['pooled_ttft_p90']:>8.2f}"
                f"{s['pooled_ttft_p99']:>8.2f}   (the same with the hits of one LRU cache of "
                "all the cluster's pages)"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "calibrate":
        from .calibrate import main as calibrate

        return calibrate(argv[1:])
    args = build_parser().parse_args(argv)
    names = policy_names() if args.policies == "all" else args.policies.split(",")
    try:
        names = [with_settings(name, from_args(TTFTConfig, args)) for name in names]
    except ValueError as e:
        print(f"error: --ttft-*: {e}", file=sys.stderr)
        return 2
    for name in names:
        try:
            make_policy(name)
        except (ValueError, TypeError) as e:
            print(f"error: --policies: {e}", file=sys.stderr)
            return 2
    try:
        timing = _timing(args)
        if args.overlap_layers is not None:
            timing = timing.with_(overlap_layers=args.overlap_layers)
        wl = build_workload(args)
        config = _config(args, timing)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    host = f" + {args.host_pages} host pages" if args.host_pages else ""
    print(
        f"workload {wl.name}: {len(wl)} requests, {wl.total_tokens()} prompt tokens "
        f"{wl.description}; {args.workers} workers x {args.pages} pages{host} of "
        f"{args.page_size}, timing {args.timing}, {args.prefill_order} prefills{_layout(args)}",
        file=sys.stderr,
    )
    results: dict[str, RunResult] = {}
    for name in names:
        results[name] = simulate(wl, name, config, progress=False if args.no_progress else name)
    summaries = {k: r.summary() for k, r in results.items()}
    print(format_table(summaries))
    if args.json_path:
        out = {
            k: {m: s[m] for m in (*JSON_KEYS, "requests", "refused", "sim_wall_s")}
            for k, s in summaries.items()
        }
        with open(args.json_path, "w") as f:
            json.dump(out, f, indent=2)
    if args.plot_path:
        from .plot import plot_results

        plot_results(results, args.plot_path, title=f"{wl.name}, {args.workers} workers")
    return 0


def _timing(args: argparse.Namespace):
    """--timing, or the gpu preset scaled to --model-layout's model (``args.timing`` says which)."""
    if args.timing is None and args.model_layout:
        args.timing = f"gpu scaled to {LAYOUTS[args.model_layout].name}"
        return hybrid_timing(LAYOUTS[args.model_layout])
    args.timing = args.timing or DEFAULT_TIMING
    return load_timing(args.timing)


def _layout(args: argparse.Namespace) -> str:
    if not args.model_layout:
        return ""
    return f"; {args.model_layout}, mamba_radix, state interval {args.state_interval}"


def _hybrid(args: argparse.Namespace, timing) -> HybridPools | None:
    """Every worker's state pool and checkpoints, for --model-layout."""
    if not args.model_layout:
        return None
    slots = args.state_slots or 2 * timing.max_running
    copy_s = state_copy_seconds(LAYOUTS[args.model_layout], timing)
    return HybridPools(slots, args.state_interval, state_copy_s=copy_s)


def _config(args: argparse.Namespace, timing) -> SimConfig:
    return SimConfig(
        num_workers=args.workers,
        num_pages=args.pages,
        host_pages=args.host_pages,
        page_size=args.page_size,
        timing=timing,
        eviction=args.eviction,
        prefill_order=args.prefill_order,
        packing=args.packing,
        event_delay_s=None if args.no_events else args.event_delay,
        optimistic_index=not args.no_optimistic,
        seed=args.seed,
        max_inflight=args.max_inflight,
        max_inflight_per_worker=args.max_inflight_per_worker,
        max_queue_s=args.max_queue_s,
        hybrid=_hybrid(args, timing),
    )
