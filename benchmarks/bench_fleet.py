"""A fleet of radixray routers against one router, live: does N routers' routing hold up?

The Mooncake workload of the live benchmark (scale 32: one conversation in 10, 300 requests,
Poisson arrivals) on the same 4 fresh ``radixray worker`` processes (tiny model, 768 pages),
behind 1, 2 and 4 radixray routers (``radixray serve --worker-urls``, policy ttft, each with its
own index fed by the same workers' events) with the requests spread round-robin over the
routers, and behind SGLang's gateway (``smg``, one instance, cache_aware) as the peer. Per
configuration: cluster hit rate from the workers' own counters, the busiest worker's share of
requests, TTFT p50 / p90 / p99, and hit rate and worker shares over time (10 s windows,
plotted).

Late join: 2 routers, the second started in the middle of the run; until it reports ready its
share of the requests goes to the first. Its hit rate over its first 10 s after ready is set
against the first router's over the same window (the steady rate).

    RAY_AUTH_MODE=disabled .venv/bin/python \\
        benchmarks/bench_fleet.py                         # ~8 min on 2 cores
    ... --quick                                           # a smoke run

Writes ``--out``/bench_fleet.{json,md,png}.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import sys
import threading
import time
from pathlib import Path

import httpx

from radixray.bench.compare import machine_info
from radixray.bench.counters import SETTLE_S, counter_delta, worker_counters
from radixray.bench.loadgen import LoadConfig, RunResult, run_load
from radixray.bench.local_cluster import (
    WorkerSpec,
    start_radixray_router,
    start_smg_router,
    start_workers,
)
from radixray.bench.peer_smg import smg_available
from radixray.bench.workloads import build_workload
from radixray.numbers import percentile

WINDOW_S = 10.0


def _warm(urls: list[str]) -> None:
    with httpx.Client(timeout=120) as c:
        for i, u in enumerate(urls):
            body = {"model": "tiny", "prompt": f"warm-up {i} " * 4, "max_tokens": 4}
            c.post(u + "/v1/completions", json=body).raise_for_status()


class RoundRobin:
    """Spreads requests over the routers that are ready (a late one joins when its /health says
    ready, as a load balancer's readiness probe would have it)."""

    def __init__(self, urls: list[str]):
        self.urls = list(urls)
        self._next = itertools.count()
        self.ready_at: dict[str, float] = {}

    def __call__(self) -> str:
        ready = [u for u in self.urls if u in self.ready_at]
        return ready[next(self._next) % len(ready)]


def _summary(run: RunResult, delta: dict) -> dict:
    ok = [r for r in run.requests if r.ok]
    workers = collections.Counter(r.worker for r in ok if r.worker)
    ttft = [r.ttft_s for r in ok]
    return {
        "requests": len(run.requests),
        "ok": len(ok),
        "hit_rate": delta["total"]["hit_rate"],
        "busiest_share": max(workers.values()) / len(ok) if ok else None,
        "worker_shares": {w: n / len(ok) for w, n in sorted(workers.items())},
        "ttft_p50_s": percentile(ttft, 50, None),
        "ttft_p90_s": percentile(ttft, 90, None),
        "ttft_p99_s": percentile(ttft, 99, None),
    }


def _windows(run: RunResult) -> list[dict]:
    """Hit rate (from each response's usage) and worker shares per WINDOW_S of the run."""
    buckets: dict[int, list] = collections.defaultdict(list)
    for r in run.requests:
        if r.ok:
            buckets[int(r.start_s // WINDOW_S)].append(r)
    out = []
    for k in sorted(buckets):
        rs = buckets[k]
        prompt = sum(r.prompt_tokens for r in rs)
        workers = collections.Counter(r.worker for r in rs)
        out.append(
            {
                "t": k * WINDOW_S,
                "hit_rate": sum(r.cached_tokens for r in rs) / prompt if prompt else None,
                "busiest_share": max(workers.values()) / len(rs),
                "requests": len(rs),
            }
        )
    return out


def _hit(requests) -> float | None:
    prompt = sum(r.prompt_tokens for r in requests)
    return sum(r.cached_tokens for r in requests) / prompt if prompt else None


def run_config(name: str, n_routers: int, args, wl, load: LoadConfig, late: bool = False):
    spec = WorkerSpec(model="tiny", num_pages=768, cpu_threads=1)
    logs = Path(args.out) / "logs" / name
    workers = start_workers(4, args.base_port, spec, logs)
    routers = []
    try:
        urls = [w.url for w in workers]
        _warm(urls)
        if name == "smg":
            port = args.base_port + 10
            routers.append(start_smg_router(port, urls, "cache_aware", logs, port + 10))
        else:
            for i in range(n_routers - (1 if late else 0)):
                port = args.base_port + 10 + i
                routers.append(start_radixray_router(port, urls, "ttft", spec, logs))
        rr = RoundRobin([r.url for r in routers])
        for r in routers:
            rr.ready_at[r.url] = time.perf_counter()
        joiner: dict = {}
        if late:
            late_port = args.base_port + 10 + n_routers - 1
            rr.urls.append(f"http://127.0.0.1:{late_port}")

            def join_later():
                time.sleep(args.late_after_s)
                proc = start_radixray_router(late_port, urls, "ttft", spec, logs)
                joiner["proc"] = proc
                rr.ready_at[proc.url] = time.perf_counter()  # its /health said ready

            threading.Thread(target=join_later, daemon=True).start()
        time.sleep(1.0)
        before = asyncio.run(worker_counters(urls))
        run_t0 = time.perf_counter()  # run_load's clock starts here (request start_s)
        run = asyncio.run(run_load(rr.urls[0], wl, load, "tiny", name, pick_url=rr))
        time.sleep(SETTLE_S)
        delta = counter_delta(before, asyncio.run(worker_counters(urls)))
        out = {"config": name, "routers": n_routers, "summary": _summary(run, delta)}
        out["windows"] = _windows(run)
        if late and "proc" in joiner:
            ready = rr.ready_at[joiner["proc"].url] - run_t0
            in_window = [r for r in run.requests if r.ok and ready <= r.start_s < ready + WINDOW_S]
            late_reqs = [r for r in in_window if r.endpoint == joiner["proc"].url]
            steady = [r for r in in_window if r.endpoint != joiner["proc"].url]
            out["late_join"] = {
                "ready_at_s": ready,
                "late_requests": len(late_reqs),
                "late_hit_rate": _hit(late_reqs),
                "steady_hit_rate": _hit(steady),
            }
            routers.append(joiner["proc"])
        return out
    finally:
        for p in routers + workers:
            p.stop()


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for res in results:
        ws = res["windows"]
        t = [w["t"] for w in ws]
        axes[0].plot(t, [w["hit_rate"] for w in ws], marker="o", label=res["config"])
        axes[1].plot(t, [w["busiest_share"] for w in ws], marker="o", label=res["config"])
    axes[0].set_ylabel(f"hit rate per {WINDOW_S:.0f} s window")
    axes[1].set_ylabel("busiest worker's share of requests")
    axes[1].axhline(0.25, color="gray", linestyle=":", linewidth=1)  # an even share
    for ax in axes:
        ax.set_xlabel("time into the run (s)")
        ax.legend(fontsize=8)
    fig.suptitle("mooncake (scale 32), 4 workers: 1 / 2 / 4 radixray routers and SGLang's router")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(results: list[dict]) -> str:
    base = next(r["summary"] for r in results if r["config"] == "radixray x1")
    lines = [
        "| routers | hit rate | vs 1 router | busiest worker | vs 1 router | TTFT p50 (ms) | vs 1"
        " router | p90 (ms) | p99 (ms) | ok |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        s = r["summary"]
        lines.append(
            f"| {r['config']} | {s['hit_rate']:.1%} | {s['hit_rate'] / base['hit_rate']:.2f}x |"
            f" {s['busiest_share']:.0%} | {s['busiest_share'] / base['busiest_share']:.2f}x |"
            f" {s['ttft_p50_s'] * 1000:.0f} | {s['ttft_p50_s'] / base['ttft_p50_s']:.2f}x |"
            f" {s['ttft_p90_s'] * 1000:.0f} | {s['ttft_p99_s'] * 1000:.0f} |"
            f" {s['ok']}/{s['requests']} |"
        )
    for r in results:
        if "late_join" in r:
            j = r["late_join"]
            ratio = (
                j["late_hit_rate"] / j["steady_hit_rate"]
                if j["late_hit_rate"] is not None and j["steady_hit_rate"]
                else None
            )
            lines.append(
                f"\nLate join ({r['config']}): ready {j['ready_at_s']:.1f} s into the run; its "
                f"first {WINDOW_S:.0f} s: {j['late_requests']} requests, hit rate "
                f"{j['late_hit_rate'] or 0:.1%} vs {j['steady_hit_rate'] or 0:.1%} on the "
                f"other router in the same window ({ratio or 0:.2f}x)"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--routers", nargs="+", type=int, default=[1, 2, 4])
    p.add_argument("--rate", type=float, default=6.0, help="requests/s (the live benchmark's)")
    p.add_argument("--limit", type=int, default=300)
    p.add_argument("--late-after-s", type=float, default=20.0)
    p.add_argument("--base-port", type=int, default=19400)
    p.add_argument("--out", default="/tmp/bench_fleet")
    p.add_argument("--no-smg", action="store_true", help="leave out SGLang's gateway (smg)")
    p.add_argument("--quick", action="store_true", help="a smoke run: seconds of load a config")
    args = p.parse_args(argv)
    if args.quick:
        # a smoke run: 1 router and 2 with the late join (the table needs x1), 40 requests at 10/s
        args.limit, args.rate, args.late_after_s, args.routers = 40, 10.0, 2.0, [1]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wl = build_workload("mooncake", limit=args.limit)
    load = LoadConfig(mode="rate", rate=args.rate, max_requests=args.limit, max_duration_s=600)
    results = []
    for n in args.routers:
        print(f"== radixray x{n}", flush=True)
        results.append(run_config(f"radixray x{n}", n, args, wl, load))
        print(json.dumps(results[-1]["summary"]), flush=True)
    print("== radixray x2, the second joining late", flush=True)
    results.append(run_config("radixray x2 (late join)", 2, args, wl, load, late=True))
    print(json.dumps(results[-1].get("late_join")), flush=True)
    if not args.no_smg and not smg_available():
        print("== smg", flush=True)
        results.append(run_config("smg", 1, args, wl, load))
    report = {"machine": machine_info(), "args": vars(args), "results": results}
    (out / "bench_fleet.json").write_text(json.dumps(report, indent=1))
    md = table(results)
    (out / "bench_fleet.md").write_text(md + "\n")
    plot(results, out / "bench_fleet.png")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
