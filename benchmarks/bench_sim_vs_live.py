"""Is the simulator right? The same Mooncake workload live and simulated, side by side.

Live: ``radixray bench compare``'s machinery (4 fresh ``radixray worker`` processes, tiny model,
page size 16, 768 pages, 1 torch thread each, radixray's router in front with each policy in
turn; hit rate from the workers' own counters). Simulated: the very same requests (each prompt
tokenized as the worker tokenizes it, cut into pages; identical pages at identical positions are
identical segments, so the sharing is the live one page for page), the same Poisson arrival
times (the load generator's seeded draw), the same cluster, and a timing model fitted to one such
worker by ``radixray sim calibrate --model tiny --cpu-threads 1``. Four workers share this
machine's cores, which one worker's fit does not know, so the simulator also runs with the fit
scaled by ``--contention`` (workers per core when all are busy): the live figures should fall
between the two.

    .venv/bin/radixray sim calibrate --model tiny --cpu-threads 1 --out /tmp/tiny_1t.json
    .venv/bin/python benchmarks/bench_sim_vs_live.py --timing /tmp/tiny_1t.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from dataclasses import replace
from pathlib import Path

from radixray.bench.cluster import WorkerSpec
from radixray.bench.compare import CompareConfig, run_compare
from radixray.bench.loadgen import LoadConfig
from radixray.bench.workloads import build_workload
from radixray.model_meta import load_model_meta
from radixray.sim import SimConfig, SimRequest, Workload, simulate
from radixray.sim.timing import load_timing

POLICIES = ("ttft", "cache_aware", "round_robin")


def sim_workload(wl, rate: float, seed: int, page_size: int, model: str) -> Workload:
    """The live workload's requests for the simulator (one completion turn per session, as the
    Mooncake workload has), arriving when the load generator sends them."""
    tok = load_model_meta(model).tokenizer
    rng = random.Random(seed)  # the load generator's draw (LoadConfig mode "rate")
    t = 0.0
    seg_of: dict[tuple, int] = {}
    reqs = []
    for i, s in enumerate(wl.sessions):
        (turn,) = s.turns
        t += rng.expovariate(rate)
        ids = tok.encode(turn.user)
        segs, parent = [], 0
        for k in range(0, len(ids), page_size):
            chunk = tuple(ids[k : k + page_size])
            seg = seg_of.setdefault((parent, chunk), len(seg_of) + 1)
            segs.append((seg, len(chunk)))
            parent = seg
        reqs.append(SimRequest(i, t, tuple(segs), turn.max_tokens, s.session_id))
    return Workload("mooncake_live", reqs, wl.sessions[0].shared_prefix_tokens, dict(wl.meta))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--timing", required=True, help="a timing file from `radixray sim calibrate`")
    p.add_argument("--contention", type=float, default=None, help="default: workers / cores")
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--rate", type=float, default=4.0)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--num-pages", type=int, default=768)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default="/tmp/bench_sim_vs_live")
    p.add_argument("--live-json", default=None, help="reuse a live run's bench_serving.json")
    args = p.parse_args(argv)
    page_size, model = 16, "tiny"
    kwargs = {"limit": args.requests, "block_tokens": 16}
    wl = build_workload("mooncake", **kwargs)
    load = LoadConfig(
        mode="rate", rate=args.rate, max_requests=args.requests, max_duration_s=600, seed=args.seed
    )
    if args.live_json:
        report = json.loads(Path(args.live_json).read_text())
    else:
        cfg = CompareConfig(
            out_dir=Path(args.out_dir),
            workloads={"mooncake": kwargs},
            loads={"mooncake": load},
            targets=tuple(f"radixray:{x}" for x in POLICIES),
            num_workers=args.workers,
            worker=WorkerSpec(model=model, page_size=page_size, num_pages=args.num_pages),
            probe_requests=3,
            command=" ".join(sys.argv),
        )
        report = run_compare(cfg)
    live = {r["policy"]: r for r in report["workloads"]["mooncake"]["rows"]}

    swl = sim_workload(wl, args.rate, args.seed, page_size, model)
    solo = load_timing(args.timing)
    k = args.contention or args.workers / (os.cpu_count() or 1)
    contended = replace(
        solo,
        **{f: getattr(solo, f) * k for f in ("step_overhead_s", "decode_seq_s", "decode_ctx_s",
                                             "prefill_token_s", "prefill_attn_s")},
    )  # fmt: skip
    sims = {}
    for label, timing in (("sim", solo), (f"sim x{k:g}", contended)):
        sc = SimConfig(
            num_workers=args.workers,
            num_pages=args.num_pages,
            page_size=page_size,
            timing=timing,
            event_delay_s=0.25,  # the router polls its workers every 0.25 s
        )
        sims[label] = {pol: simulate(swl, pol, sc).summary() for pol in POLICIES}

    print(f"{len(swl)} requests at {args.rate}/s, {args.workers} workers x {args.num_pages} pages")
    head = "| policy | source | hit rate | TTFT p50 ms | p90 ms | p99 ms |"
    lines = [head, "|---|---|---|---|---|---|"]
    for pol in POLICIES:
        r = live[pol]
        lines.append(
            f"| {pol} | live | {r['hit_rate']:.3f} | {r['ttft_p50_s'] * 1e3:.0f} | "
            f"{r['ttft_p90_s'] * 1e3:.0f} | {r['ttft_p99_s'] * 1e3:.0f} |"
        )
        for label, res in sims.items():
            s = res[pol]
            lines.append(
                f"| {pol} | {label} | {s['hit_rate']:.3f} | {s['ttft_p50'] * 1e3:.0f} | "
                f"{s['ttft_p90'] * 1e3:.0f} | {s['ttft_p99'] * 1e3:.0f} |"
            )
    print("\n".join(lines))
    out = Path(args.out_dir) / "sim_vs_live.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"live": live, "sim": sims}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
