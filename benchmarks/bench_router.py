"""What a router process costs per request: radixray's (over HTTP workers and over Ray actors)
beside SGLang's model gateway (PyPI ``smg``, its Rust router today), in front of the same workers.

Setup: two ``radixray worker`` processes (tiny random Llama, byte tokenizer, 1 torch thread
each, page size 16) serve the HTTP targets; ``radixray serve`` starts two Ray actors of the same
spec for the Ray target. Targets, one at a time under load, in alternating order over repeats:

    smg        python -m smg.launch_router --policy cache_aware            (HTTP workers)
    http       radixray serve --worker-urls ...     --policy ttft           (HTTP workers)
    ray        radixray serve --workers 2           --policy ttft           (Ray actors)

Per target and load shape (``max_tokens=1`` non-streaming; 64-token streams, ``ignore_eos``):
``--requests`` requests with ``--concurrency`` in flight from this process (aiohttp, keep-alive);
the router process's CPU time (utime + stime of /proc/<pid>/stat, all its threads) before and
after, divided by the requests: **CPU per request**. RSS is /proc/<pid>/status VmRSS after the
load. Prompts: 8 shared 256-character prefixes, a unique suffix each (cache-aware routing has
work to do), the same for every target.

Added latency: sequential single requests of each load shape, in rounds; each round sends one
request direct to an HTTP worker and one through each router, in shuffled order; the figures
are the p50 and p99 over rounds of (through the router - direct), for the time to the first
text and to the end of the answer. The Ray target's
workers are Ray actors with no HTTP of their own: its baseline is the same direct HTTP worker
(same engine config).

    .venv/bin/python benchmarks/bench_router.py                 # ~6 min on 2 cores
    .venv/bin/python benchmarks/bench_router.py --quick         # smoke run
    .venv/bin/python benchmarks/bench_router.py --targets http ray --repeats 1

Writes ``--out``/bench_router.{json,md,png}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import aiohttp
from tqdm import tqdm

from radixray.bench.compare import machine_info
from radixray.bench.local_cluster import (
    Proc,
    WorkerSpec,
    start_radixray_ray_router,
    start_radixray_router,
    start_smg_router,
    start_workers,
)
from radixray.bench.peer_smg import smg_available

TARGETS = ("smg", "http", "ray")
SHAPES = {
    "max_tokens=1": {"max_tokens": 1, "stream": False},
    "64-token stream": {"max_tokens": 64, "stream": True, "ignore_eos": True},
}
_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, all its threads, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime (fields 14, 15)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def prompts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    prefixes = ["".join(rng.choice("abcdefghij klmnop") for _ in range(256)) for _ in range(8)]
    return [f"{prefixes[i % 8]} request {i} {rng.random():.6f}" for i in range(n)]


async def _one(session: aiohttp.ClientSession, url: str, body: dict) -> bool:
    async with session.post(url + "/v1/completions", json=body) as r:
        if r.status != 200:
            await r.read()
            return False
        if body.get("stream"):
            async for _ in r.content:
                pass
        else:
            await r.read()
        return True


async def load(url: str, shape: dict, texts: list[str], concurrency: int) -> tuple[int, float]:
    """Send every text once with ``concurrency`` in flight; returns (failures, seconds)."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for t in texts:
        queue.put_nowait(t)
    failed = 0
    bar = tqdm(total=len(texts), leave=False, desc=f"  {url}")
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(120)) as s:

        async def user():
            nonlocal failed
            while not queue.empty():
                text = queue.get_nowait()
                body = {"model": "tiny", "prompt": text, "temperature": 0.0} | shape
                ok = await _one(s, url, body)
                failed += not ok
                bar.update()

        t0 = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(concurrency)))
        dt = time.perf_counter() - t0
    bar.close()
    return failed, dt


def measure_cpu(proc: Proc, shape: dict, texts: list[str], concurrency: int) -> dict:
    asyncio.run(load(proc.url, shape, texts[:50], concurrency))  # warm connections and caches
    time.sleep(0.5)
    c0 = cpu_seconds(proc.pid)
    failed, dt = asyncio.run(load(proc.url, shape, texts, concurrency))
    c1 = cpu_seconds(proc.pid)
    n = len(texts)
    return {
        "cpu_ms_per_request": (c1 - c0) / n * 1000,
        "requests_per_s": n / dt,
        "failed": failed,
        "rss_mb": rss_mb(proc.pid),
    }


async def _timed(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[float, float]:
    """(time to the first text, time to the end) of one request, in seconds (nan: failed)."""
    t0 = time.perf_counter()
    first = None
    async with session.post(url + "/v1/completions", json=body) as r:
        if r.status != 200:
            await r.read()
            return float("nan"), float("nan")
        if body.get("stream"):
            async for line in r.content:
                if first is None and line.startswith(b"data: {") and b'"text":""' not in line:
                    first = time.perf_counter() - t0
        else:
            await r.read()
    end = time.perf_counter() - t0
    return (first if first is not None else end), end


async def _latency_rounds(points: dict[str, str], rounds: int, seed: int) -> dict:
    """``{shape: {target: [(ttft, e2e), ...]}}``: sequential requests, one per target per shape
    per round, the targets in shuffled order."""
    rng = random.Random(seed)
    texts = prompts(rounds, seed=seed + 1)
    out: dict = {shape: {name: [] for name in points} for shape in SHAPES}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(60)) as s:
        for url in points.values():  # warm every path
            for shape in SHAPES.values():
                await _timed(s, url, {"model": "tiny", "prompt": "warm up"} | shape)
        for i in tqdm(range(rounds), desc="added latency", leave=False):
            for shape_name, shape in SHAPES.items():
                order = list(points.items())
                rng.shuffle(order)
                for name, url in order:
                    body = {"model": "tiny", "prompt": texts[i], "temperature": 0.0} | shape
                    out[shape_name][name].append(await _timed(s, url, body))
    return out


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def added_latency(samples: dict) -> dict:
    """Per shape and target: p50 / p99 over rounds of (through the router - direct), ms."""
    out: dict = {}
    for shape, by_target in samples.items():
        direct = by_target["direct"]
        for name, xs in by_target.items():
            if name == "direct":
                continue
            row = {"failed": sum(x != x for x, _ in xs)}  # nan != nan
            for k, label in ((0, "ttft"), (1, "e2e")):
                diffs = [
                    (x[k] - d[k]) * 1000
                    for x, d in zip(xs, direct, strict=True)
                    if x[k] == x[k] and d[k] == d[k]
                ]
                row[f"{label}_p50_ms"] = statistics.median(diffs) if diffs else None
                row[f"{label}_p99_ms"] = _pct(diffs, 0.99) if diffs else None
            out.setdefault(shape, {})[name] = row
    return out


def start_target(target: str, urls: list[str], spec: WorkerSpec, port: int, logs: Path) -> Proc:
    if target == "smg":
        return start_smg_router(port, urls, "cache_aware", logs, port + 100)
    if target == "http":
        return start_radixray_router(port, urls, "ttft", spec, logs)
    if target == "ray":
        return start_radixray_ray_router(port, len(urls), "ttft", spec, logs)
    raise ValueError(f"target must be one of {TARGETS}, got {target!r}")


def run(args) -> dict:
    spec = WorkerSpec(model="tiny", num_pages=768, cpu_threads=1)
    logs = Path(args.out) / "logs"
    texts = prompts(args.requests)
    targets = list(args.targets)
    if "smg" in targets and (why := smg_available()):
        print(f"skipping smg: {why}", file=sys.stderr)
        targets.remove("smg")
    results: dict = {t: {s: [] for s in SHAPES} for t in targets}
    workers = start_workers(2, args.base_port, spec, logs)
    try:
        urls = [w.url for w in workers]
        for rep in range(args.repeats):
            order = targets if rep % 2 == 0 else targets[::-1]
            for i, target in enumerate(order):
                proc = start_target(target, urls, spec, args.base_port + 10 + i, logs)
                try:
                    time.sleep(1.0)  # first polls / health checks
                    for shape_name, shape in SHAPES.items():
                        n = args.requests if shape_name == "max_tokens=1" else args.requests // 4
                        m = measure_cpu(proc, shape, texts[:n], args.concurrency)
                        results[target][shape_name].append(m)
                        print(f"  rep {rep} {target:6} {shape_name:16} {m}", flush=True)
                finally:
                    proc.stop()
        # Added latency: every router up at once in front of the same workers.
        procs = [
            start_target(t, urls, spec, args.base_port + 30 + i, logs)
            for i, t in enumerate(targets)
        ]
        try:
            time.sleep(1.0)
            points = {"direct": urls[0]} | {t: p.url for t, p in zip(targets, procs, strict=True)}
            latency = added_latency(asyncio.run(_latency_rounds(points, args.rounds, seed=1)))
        finally:
            for p in procs:
                p.stop()
    finally:
        for w in workers:
            w.stop()
    return {"machine": machine_info(), "args": vars(args), "runs": results, "latency": latency}


def summarize(res: dict) -> str:
    runs, lat = res["runs"], res["latency"]
    lines = [
        "| router | load | CPU per request (ms), median of runs | runs | req/s | RSS (MB) |"
        " failed |",
        "|---|---|---:|---|---:|---:|---:|",
    ]
    names = {
        "smg": "SGLang's gateway smg (cache_aware)",
        "http": "radixray, HTTP workers",
        "ray": "radixray, Ray actors",
    }
    for target, shapes in runs.items():
        for shape, ms in shapes.items():
            cpu = [m["cpu_ms_per_request"] for m in ms]
            lines.append(
                f"| {names[target]} | {shape} | {statistics.median(cpu):.3f} | "
                f"{', '.join(f'{c:.3f}' for c in cpu)} | "
                f"{statistics.median(m['requests_per_s'] for m in ms):.0f} | "
                f"{max(m['rss_mb'] for m in ms):.0f} | {sum(m['failed'] for m in ms)} |"
            )
    lines += [
        "",
        "| router | load | added e2e p50 (ms) | e2e p99 (ms) | added TTFT p50 (ms) |"
        " TTFT p99 (ms) | failed |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for shape, by_target in lat.items():
        for target, v in by_target.items():
            lines.append(
                f"| {names[target]} | {shape} | {v['e2e_p50_ms']:+.2f} | {v['e2e_p99_ms']:+.2f} |"
                f" {v['ttft_p50_ms']:+.2f} | {v['ttft_p99_ms']:+.2f} | {v['failed']} |"
            )
    ratios = []
    med = {
        (t, s): statistics.median(m["cpu_ms_per_request"] for m in ms)
        for t, shapes in runs.items()
        for s, ms in shapes.items()
    }
    for s in SHAPES:
        for num, den, label in (("http", "smg", "HTTP / smg"), ("ray", "http", "Ray / HTTP")):
            if (num, s) in med and (den, s) in med:
                ratios.append(f"{s}: {label} = {_ratio(med[num, s], med[den, s])}")
    return "\n".join(lines + [""] + [f"- {r}" for r in ratios])


def _ratio(num: float, den: float) -> str:
    """``num / den`` as ``1.23x``; a run shorter than one CPU clock tick reads 0 ms: no ratio."""
    if den <= 0:
        tick_ms = 1000 / _TICKS
        return f"n/a (the denominator ran under one {tick_ms:.0f} ms clock tick: add --requests)"
    return f"{num / den:.2f}x"


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = res["runs"]
    targets = list(runs)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    width = 0.8 / len(SHAPES)
    for j, shape in enumerate(SHAPES):
        vals = [statistics.median(m["cpu_ms_per_request"] for m in runs[t][shape]) for t in targets]
        xs = [i + j * width for i in range(len(targets))]
        axes[0].bar(xs, vals, width, label=shape)
    axes[0].set_xticks([i + width / 2 for i in range(len(targets))], targets)
    axes[0].set_ylabel("router CPU per request (ms)")
    axes[0].legend()
    rss = [max(m["rss_mb"] for s in SHAPES for m in runs[t][s]) for t in targets]
    axes[1].bar(targets, rss, color="gray")
    axes[1].set_ylabel("router RSS (MB)")
    fig.suptitle("router process cost (2 tiny workers, same machine)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--targets", nargs="+", default=list(TARGETS), choices=TARGETS)
    p.add_argument("--requests", type=int, default=600)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--rounds", type=int, default=200, help="added-latency rounds")
    p.add_argument("--base-port", type=int, default=19300)
    p.add_argument("--out", default="/tmp/bench_router")
    p.add_argument("--quick", action="store_true", help="a smoke run: few requests, one repeat")
    args = p.parse_args(argv)
    if args.quick:
        args.requests, args.repeats, args.rounds = 80, 1, 20
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res = run(args)
    table = summarize(res)
    (out / "bench_router.json").write_text(json.dumps(res, indent=1))
    (out / "bench_router.md").write_text(table + "\n")
    plot(res, out / "bench_router.png")
    print(json.dumps(res["machine"]))
    print(table)
    print(f"wrote {out}/bench_router.{{json,md,png}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
