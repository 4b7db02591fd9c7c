"""Where a tiered worker's time goes: one engine, the live benchmark's requests, with and
without a host tier (benchmarks/HISTORY.md, "Live host tiers: where the time went").

    python benchmarks/bench_tier_steps.py                  # 3 interleaved runs per setting
    python benchmarks/bench_tier_steps.py --profile /tmp/p # also cProfile each setting once
    python benchmarks/bench_tier_steps.py --quick          # a short smoke run

One in-process engine as ``radixray worker`` builds it for ``bench_serving.py`` (the tiny model,
byte tokenizer, page 16, 1 torch thread, 384 device pages), driven on this thread through the
Mooncake replay at scale 32 as the live benchmark builds it, one conversation in 40 of the
trace (a quarter of the live run's conversations, whole: what one of four workers gets when
the router keeps a conversation together) at a quarter of its rate, with Poisson arrivals in
real time. Every ``--poll-s`` the driver does what a router's poll makes the worker do: take
the KV events, encode them and build the load report. Settings: ``--host-pages 0`` and
``3072``, interleaved run by run.

Per setting (median over the runs): TTFT inside the engine (p50, p99), per step the forward
(less its copies), the copies and everything else, and the number of engine steps from a
request's arrival to its first token.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from radixray.bench.loadgen import session_starts  # noqa: E402
from radixray.bench.workloads import build_workload  # noqa: E402
from radixray.cache_index.events import EventBatch, encode_events  # noqa: E402
from radixray.numbers import percentile  # noqa: E402
from radixray.protocol import SamplingParams  # noqa: E402
from radixray.worker import Engine, EngineConfig  # noqa: E402
from radixray.worker.model_runner import load_for_engine  # noqa: E402


def requests(args) -> list[tuple[float, str, int]]:
    """(arrival s, prompt, max_tokens) of the replay, in arrival order."""
    wl = build_workload(
        "mooncake", limit=args.requests, block_tokens=16, sample_every=args.sample_every
    )
    starts = session_starts(args.rate, args.seed)
    turns = [s.turns[0] for s in wl.sessions]
    return [(t, turn.user, turn.max_tokens) for turn, t in zip(turns, starts, strict=False)]


def run(config: EngineConfig, loaded, reqs, poll_s: float, profile=None) -> dict:
    e = Engine(config, loaded=loaded)
    arrived: dict[str, int] = {}  # request id -> steps done when it arrived
    first: dict[str, int] = {}  # request id -> steps done when its first token came
    step_wall: list[float] = []
    events = 0

    def sink(rid: str):
        def take(chunk) -> None:
            first.setdefault(rid, len(step_wall) + 1)

        return take

    t0 = time.perf_counter()
    next_poll, i = t0, 0
    if profile is not None:
        profile.enable()
    while i < len(reqs) or e.has_work():
        now = time.perf_counter()
        while i < len(reqs) and t0 + reqs[i][0] <= now:
            _, prompt, out = reqs[i]
            params = SamplingParams(max_tokens=out, temperature=0.0)
            rid = f"r{i}"
            e.add(e.requests.build(prompt, params, rid, None), sink(rid))
            arrived[rid] = len(step_wall)
            i += 1
        if now >= next_poll:  # a router's poll: events out, load report built
            new = e.cache.take_events()
            events += len(new)
            encode_events(EventBatch("w", 0, time.time(), new))
            e.report()
            next_poll = now + poll_s
        if not e.has_work():
            time.sleep(max(0.0, min(t0 + reqs[i][0], next_poll) - time.perf_counter()))
            continue
        s0 = time.perf_counter()
        e.step()
        step_wall.append(time.perf_counter() - s0)
    if profile is not None:
        profile.disable()
    steps = list(e.meter.step_log)
    forward = sum(s[4] for s in steps)
    ttft = [t for _, _, t in e.meter.first_token_log]
    s = e.stats()
    wall = sum(step_wall)
    return {
        "requests": len(ttft),
        "ttft_p50_ms": 1e3 * percentile(ttft, 50),
        "ttft_p99_ms": 1e3 * percentile(ttft, 99),
        "steps": len(steps),
        "step_ms": 1e3 * wall / len(steps),
        "forward_ms": 1e3 * forward / len(steps),
        "copies_ms": 1e3 * s["copy_seconds"] / len(steps),
        "other_ms": 1e3 * (wall - forward - s["copy_seconds"]) / len(steps),
        "steps_to_first_p50": percentile([first[r] - arrived[r] for r in first], 50),
        "steps_to_first_mean": statistics.fmean(first[r] - arrived[r] for r in first),
        "hit_rate": s["hit_rate"],
        "host_tokens": s["miss_tokens"]["host"],
        "demoted_pages": s.get("demoted_pages", 0),
        "loaded_pages": s.get("loaded_pages", 0),
        "events": events,
    }


# the host tier's own code, listed from the profile whatever its rank
TIER_FILES = ("host_tier.py", "host_copies.py", "memory_pool.py", "events.py", "stats.py")


def top(profile: cProfile.Profile, n: int) -> str:
    """The ``n`` radixray functions with the most cumulative time, then the host tier's."""
    st = pstats.Stats(profile)
    st.sort_stats("cumulative")
    rows, tier = [], []
    for (path, line, fn), (_, nc, tt, ct, _) in st.stats.items():
        if "radixray" in path:
            row = (ct, nc, tt, f"{Path(path).name}:{line}({fn})")
            rows.append(row)
            if Path(path).name in TIER_FILES:
                tier.append(row)
    rows.sort(reverse=True)
    tier.sort(reverse=True)
    picked = rows[:n] + [r for r in tier if r not in rows[:n]]
    return "\n".join(f"{ct:8.3f} {tt:8.3f} {nc:8d}  {name}" for ct, nc, tt, name in picked)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--sample-every", type=int, default=40)
    p.add_argument("--rate", type=float, default=3.0, help="arrivals per second")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-pages", type=int, default=384)
    p.add_argument("--host-pages", type=int, nargs="+", default=[0, 3072])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--poll-s", type=float, default=0.25, help="a router's poll interval")
    p.add_argument("--profile", help="cProfile each setting's first run; write the tops here")
    p.add_argument("--out", help="write the results as JSON")
    p.add_argument("--quick", action="store_true", help="40 requests at 20/s, 1 run each")
    args = p.parse_args(argv)
    if args.quick:
        args.requests, args.rate, args.repeats = 40, 20.0, 1
    config = EngineConfig(model="tiny", page_size=16, num_pages=args.num_pages, cpu_threads=1)
    loaded = load_for_engine(config, torch.device("cpu"))
    reqs = requests(args)
    print(
        f"{len(reqs)} requests over {reqs[-1][0]:.0f} s, {platform.python_version()}, "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    results: dict[int, list[dict]] = {h: [] for h in args.host_pages}
    profiles: dict[int, cProfile.Profile] = {}
    for rep in range(args.repeats):
        for h in args.host_pages:
            prof = cProfile.Profile() if args.profile and rep == 0 else None
            cfg = EngineConfig(**{**config.__dict__, "host_pages": h})
            r = run(cfg, loaded, reqs, args.poll_s, prof)
            r["load_average"] = os.getloadavg()[0]
            results[h].append(r)
            if prof is not None:
                profiles[h] = prof
            print(f"host_pages={h} run {rep}: {json.dumps(r)}", flush=True)
    keys = ("ttft_p50_ms", "ttft_p99_ms", "step_ms", "forward_ms", "copies_ms", "other_ms",
            "steps_to_first_mean", "hit_rate", "events")  # fmt: skip
    print("\n| host pages | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for h, rs in results.items():
        med = [statistics.median(r[k] for r in rs) for k in keys]
        print(f"| {h} | " + " | ".join(f"{v:.3g}" for v in med) + " |")
    for h, prof in profiles.items():
        text = top(prof, 40)
        print(f"\ncProfile, host_pages={h} (cumulative s, own s, calls):\n{text}")
        Path(f"{args.profile}_{h}.txt").write_text(text + "\n")
    if args.out:
        Path(args.out).write_text(json.dumps({str(h): rs for h, rs in results.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
