"""Side by side on the same workers: radixray's router and SGLang's (``smg``), one run each.

For every workload and every target (``radixray:ttft``, ``smg:cache_aware``, ...) the same
``num_workers`` ``radixray worker`` processes are started fresh (cold caches, same config), the
router is started in front of them, the workload is replayed with the same load settings, and
the cluster hit rate is read from the workers' own counters before and after.

Added latency is measured separately, per workload, with every router up at once in front of
one set of workers: ``probe_requests`` rounds (0: no probe), each sending one request (the
workload's first prompt, ``max_tokens=1``, streamed) directly to worker 0 and through every
router, in a shuffled order. A target's added latency is the median over rounds of its
end-to-end time minus the direct one of the same round (paired, so drifting background load
cancels).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import platform
import random
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import httpx

from radixray.sysinfo import cpu_model

from .counters import SETTLE_S, counter_delta, merge_deltas, worker_counters, worker_steps
from .loadgen import LoadConfig, RequestResult, RunResult, run_load, stream_request
from .local_cluster import (
    Proc,
    WorkerSpec,
    served_name,
    start_radixray_router,
    start_smg_router,
    start_workers,
    warm,
)
from .peer_smg import smg_available, smg_version
from .report import (
    breakdown_table,
    markdown_table,
    median_table,
    plot,
    summarize,
    tier_table,
    write_json,
)
from .targets import parse_target
from .workloads import BenchWorkload, build_workload

__all__ = ["CompareConfig", "run_compare", "DEFAULT_TARGETS", "machine_info"]

# what each repeat's summary keeps (medians over repeats are read from these)
REPEAT_KEYS = (
    "hit_rate",
    "device_hit_rate",
    "host_load_rate",
    "ttft_mean_s",
    "ttft_p50_s",
    "ttft_p99_s",
    "throughput_rps",
    "step_period_ms",
    "refused",
    "errors",
    "router_ttft_p50_s",
)

DEFAULT_TARGETS = (
    "radixray:ttft",
    "radixray:cache_aware",
    "radixray:round_robin",
    "smg:cache_aware",
    "smg:round_robin",
)


@dataclass(frozen=True)
class CompareConfig:
    out_dir: Path
    workloads: dict[str, dict] = field(default_factory=dict)  # name -> builder kwargs
    loads: dict[str, LoadConfig] = field(default_factory=dict)  # name -> load settings
    targets: tuple[str, ...] = DEFAULT_TARGETS
    num_workers: int = 4
    worker: WorkerSpec = field(default_factory=WorkerSpec)
    base_port: int = 18100
    probe_requests: int = 100
    repeats: int = 1
    command: str = ""
    # keep every worker's step log of each run (``/debug/steps``): what bench_sim_vs_live.py fits
    # the simulator's timing to
    step_logs: bool = False
    # The cores the router under test runs on, and the workers (with the load generator): a
    # router on a core of its own, as a deployment places it (empty: every process anywhere).
    router_cpus: tuple[int, ...] = ()
    worker_cpus: tuple[int, ...] = ()

    def __post_init__(self):
        for t in self.targets:
            parse_target(t)  # ValueError naming the bad target
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        missing = set(self.workloads) - set(self.loads)
        if missing:
            raise ValueError(f"no load settings for workloads {sorted(missing)}")


def machine_info() -> dict:
    cpu = cpu_model()
    try:
        repo = Path(__file__).resolve().parents[2]
        commit = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "load_avg_at_start": os.getloadavg(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "smg": smg_version(),
        "git_commit": commit,
    }


def _grpc_ports(cfg: CompareConfig) -> tuple[int, ...]:
    """The workers' gRPC ports (served only for an ``smg-grpc`` target's runs)."""
    return tuple(cfg.base_port + 60 + k for k in range(cfg.num_workers))


def _workers(cfg: CompareConfig, spec: WorkerSpec, log_dir: Path, targets) -> list[Proc]:
    grpc = _grpc_ports(cfg) if any(t.startswith("smg-grpc:") for t in targets) else ()
    cpus = cfg.worker_cpus or None
    return start_workers(cfg.num_workers, cfg.base_port, spec, log_dir, cpus=cpus, grpc_ports=grpc)


def _start_router(target: str, i: int, urls: list[str], cfg: CompareConfig, log_dir: Path) -> Proc:
    t = parse_target(target)
    port = cfg.base_port + 20 + i
    cpus = cfg.router_cpus or None
    if t.router == "radixray":
        spec = t.worker_spec(cfg.worker)
        return start_radixray_router(port, urls, t.policy, spec, log_dir, cpus=cpus)
    if t.router == "smg-grpc":  # smg's event-driven index: the workers over gRPC
        urls = [f"grpc://127.0.0.1:{p}" for p in _grpc_ports(cfg)]
    return start_smg_router(port, urls, t.policy, log_dir, cfg.base_port + 40 + i, cpus=cpus)


async def _probe(targets: dict[str, str], body: dict, rounds: int, seed: int) -> dict[str, list]:
    """Paired sequential requests; returns e2e seconds per target per round (None: failed)."""
    rng = random.Random(seed)
    out: dict[str, list] = {t: [] for t in targets}
    body = dict(body, max_tokens=1, temperature=0.0)
    async with httpx.AsyncClient(timeout=60) as client:
        for _ in range(3):  # warm connections and caches
            for url in targets.values():
                await stream_request(client, url, body, RequestResult("warm", 0, 0.0), 60)
        for _ in range(rounds):
            order = list(targets.items())
            rng.shuffle(order)
            for name, url in order:
                r = await stream_request(client, url, body, RequestResult("probe", 0, 0.0), 60)
                out[name].append(r.e2e_s if r.ok else None)
    return out


def _added_latency(samples: dict[str, list]) -> dict[str, dict]:
    direct = samples["direct"]
    out = {}
    for name, xs in samples.items():
        pairs = [x - d for x, d in zip(xs, direct, strict=True) if x is not None and d is not None]
        ok = [x for x in xs if x is not None]
        out[name] = {
            "e2e_p50_s": statistics.median(ok) if ok else None,
            "added_p50_s": statistics.median(pairs) if pairs else None,
            "failed": len(xs) - len(ok),
        }
    return out


def _measure_added_latency(
    wl: BenchWorkload, cfg: CompareConfig, targets: tuple[str, ...], log_dir: Path
) -> dict[str, dict]:
    workers = _workers(cfg, cfg.worker, log_dir / "probe", targets)
    routers: list[Proc] = []
    try:
        urls = [w.url for w in workers]
        for i, t in enumerate(targets):
            routers.append(_start_router(t, i, urls, cfg, log_dir / "probe"))
        points = {"direct": urls[0]} | {t: r.url for t, r in zip(targets, routers, strict=True)}
        body = wl.sessions[0].request_body(served_name(cfg.worker.model), 0, [])
        samples = asyncio.run(_probe(points, body, cfg.probe_requests, seed=1))
        return _added_latency(samples)
    finally:
        for p in routers + workers:
            p.stop()


def _run_one(
    wl: BenchWorkload, target: str, i: int, load: LoadConfig, cfg: CompareConfig, log_dir: Path
) -> tuple[RunResult, dict]:
    """One run on fresh workers: the load run and the workers' counter deltas."""
    model = served_name(cfg.worker.model)
    spec = parse_target(target).worker_spec(cfg.worker)
    workers = _workers(cfg, spec, log_dir / target, (target,))
    router = None
    try:
        urls = [w.url for w in workers]
        warm(urls, model)
        router = _start_router(target, i, urls, cfg, log_dir / target)
        time.sleep(1.0)  # the radixray router's first polls; smg's health checks
        before = asyncio.run(worker_counters(urls))
        if cfg.step_logs:
            seen = asyncio.run(worker_steps(None, urls))
        label = f"{wl.name} {target}"
        run = asyncio.run(run_load(router.url, wl, replace(load), model=model, target=label))
        time.sleep(SETTLE_S)
        after = asyncio.run(worker_counters(urls))
        delta = counter_delta(before, after)
        if cfg.step_logs:
            counts = {u: (seen[u]["steps"], seen[u]["first_tokens"]) for u in urls}
            delta["steps"] = asyncio.run(worker_steps(counts))
        if target.startswith("radixray:"):
            delta["decisions"] = _decisions(router.url)
        return run, delta
    finally:
        if router is not None:
            router.stop()
        for w in workers:
            w.stop()


def _decisions(url: str) -> list[dict]:
    """The radixray router's decision log (chosen worker, predicted vs actual cached tokens,
    queued prefill at decision time, scores): the evidence for where hits and time went."""
    try:
        r = httpx.get(url + "/debug/decisions", params={"limit": 4096}, timeout=10)
        r.raise_for_status()
        return r.json()["decisions"]
    except (httpx.HTTPError, ValueError, KeyError):
        return []


def _router_ttft_p50(decisions: list[dict] | None) -> float | None:
    """The median TTFT the radixray router itself measured (from routing a request, after
    tokenizing and hashing it, to its first chunk): next to the client's TTFT it shows how much
    of a request's wait was spent in the router process before routing (a saturated router)
    rather than on a worker."""
    xs = sorted(d["ttft_s"] for d in decisions or () if d.get("ttft_s") is not None)
    return statistics.median(xs) if xs else None


def _pool(runs: list[tuple[RunResult, dict]]) -> tuple[RunResult, dict]:
    """Repeats of one target as one run: requests back to back in time, counters summed."""
    requests: list[RequestResult] = []
    offset = 0.0
    for run, _ in runs:
        for r in run.requests:
            requests.append(replace(r, start_s=r.start_s + offset))
        offset += max((r.start_s + (r.e2e_s or 0.0) for r in run.requests), default=0.0)
    first = runs[0][0]
    pooled = RunResult(
        first.target,
        first.url,
        first.config,
        requests,
        sum(run.duration_s for run, _ in runs),
        first.started_at,
    )
    merged = merge_deltas([d for _, d in runs])
    merged["decisions"] = [d.get("decisions", []) for _, d in runs]
    return pooled, merged


def _run_repeats(wl, targets: tuple, load, cfg: CompareConfig, log_dir: Path):
    """Run every target ``cfg.repeats`` times, alternating the order (forward, backward, ...).
    Returns each target's ``(run, counters delta)`` per repeat and its per-repeat summary."""
    runs: dict[str, list] = {t: [] for t in targets}
    per_repeat: dict[str, list] = {t: [] for t in targets}
    for rep in range(cfg.repeats):
        order = list(enumerate(targets))
        if rep % 2:
            order.reverse()
        for i, target in order:
            load_avg = os.getloadavg()[0]  # the shared machine's load as this run starts
            run, delta = _run_one(wl, target, i, load, cfg, log_dir / f"rep{rep}")
            runs[target].append((run, delta))
            row = summarize(run, delta)
            row["router_ttft_p50_s"] = _router_ttft_p50(delta.get("decisions"))
            per_repeat[target].append({k: row.get(k) for k in REPEAT_KEYS} | {"load_avg": load_avg})
            p50, p99 = (row[k] or 0.0 for k in ("ttft_p50_s", "ttft_p99_s"))
            print(
                f"   [{rep}] {target:22s} hit {row['hit_rate']:.1%}  TTFT p50 "
                f"{p50 * 1000:.0f} ms  p99 {p99 * 1000:.0f} ms  "
                f"{row['throughput_rps']:.2f} req/s  host loads {row['host_load_rate']:.1%}  "
                f"refused {row['refused']}  errors {row['errors']}"
                + (f"  step {row['step_period_ms']:.2f} ms" if row.get("step_period_ms") else ""),
                flush=True,
            )
    return runs, per_repeat


def _workload_report(name: str, wl, load, targets: tuple, cfg: CompareConfig, log_dir: Path):
    """Measure one workload on every target: its report entry and its TTFT curves."""
    print(f"== {name}: {len(wl.sessions)} sessions, {wl.num_requests} requests", flush=True)
    # probe_requests 0: no added-latency probe (a load sweep's runs need only the load)
    added = _measure_added_latency(wl, cfg, targets, log_dir) if cfg.probe_requests else {}
    runs, per_repeat = _run_repeats(wl, targets, load, cfg, log_dir)
    rows, requests, step_logs, decisions = [], {}, {}, {}
    for target in targets:
        if cfg.step_logs:
            step_logs[target] = [d.get("steps") for _, d in runs[target]]
        run, delta = _pool(runs[target])
        if target.startswith("radixray:"):
            decisions[target] = delta["decisions"]  # one log per repeat
        row = summarize(run, delta)
        t = parse_target(target)
        row.update(router=t.router, policy=t.name.partition(":")[2], workload=name)
        row["added_latency_p50_s"] = added.get(target, {}).get("added_p50_s")
        row["per_repeat"] = per_repeat[target]
        rows.append(row)
        requests[target] = [r.as_dict() for r in run.requests]
    entry = {
        "meta": wl.meta,
        "load": asdict(load),
        "rows": rows,
        "added_latency": added,
        "requests": requests,
        "decisions": decisions,
    } | ({"step_logs": step_logs} if cfg.step_logs else {})
    curves = [
        (
            f"{r['router']}:{r['policy']}",
            [x["ttft_s"] for x in requests[t] if x["ok"]],
            r["hit_rate"],
        )
        for r, t in zip(rows, targets, strict=True)
    ]
    return entry, curves


def run_compare(cfg: CompareConfig) -> dict:
    """Run everything; write ``bench_serving.{json,png,md}`` under ``cfg.out_dir``.

    With ``repeats`` > 1 the targets run in alternating order (forward, backward, ...) so that
    slow drifts of a shared machine's background load fall on every target alike; each
    target's repeats are pooled (requests together, worker counters summed). With
    ``worker_cpus`` the load generator (this process) runs on the workers' cores."""
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.worker_cpus:
        os.sched_setaffinity(0, cfg.worker_cpus)
    targets = cfg.targets
    why_not = smg_available()
    skipped = []
    if why_not:
        skipped = [t for t in targets if t.startswith(("smg:", "smg-grpc:"))]
        targets = tuple(t for t in targets if not t.startswith(("smg:", "smg-grpc:")))
        print(f"skipping {skipped}: {why_not}", flush=True)
    report: dict = {
        "machine": machine_info(),
        "command": cfg.command,
        "num_workers": cfg.num_workers,
        "worker": asdict(cfg.worker),
        "targets": list(targets),
        "repeats": cfg.repeats,
        "layout": {"router_cpus": list(cfg.router_cpus), "worker_cpus": list(cfg.worker_cpus)},
        "skipped_targets": dict.fromkeys(skipped, why_not),
        "workloads": {},
    }
    curves: dict[str, list] = {}
    for name, kwargs in cfg.workloads.items():
        wl = build_workload(name, **kwargs)
        entry, curves[name] = _workload_report(
            name, wl, cfg.loads[name], targets, cfg, out / "logs" / name
        )
        report["workloads"][name] = entry
        write_json(out / "bench_serving.json", report)  # partial results survive a crash
    write_json(out / "bench_serving.json", report)
    plot(out / "bench_serving.png", curves)
    md = []
    for name, w in report["workloads"].items():
        tables = (markdown_table, breakdown_table, tier_table, median_table)
        md.append(f"### {name}\n\n" + "\n".join(t(w["rows"]) for t in tables))
    (out / "bench_serving.md").write_text("\n".join(md))
    return report
