"""Is the simulator right? The same workloads live and simulated, side by side.

Live: ``radixray bench compare``'s machinery (4 fresh ``radixray worker`` processes, tiny model,
page size 16, 768 pages, 1 torch thread each, radixray's router in front with each policy in
turn; hit rate from the workers' own counters). Simulated: the very same requests (each prompt
tokenized as the worker tokenizes it, cut into pages; identical pages at identical positions are
identical segments, so the sharing is the live one page for page), the same Poisson arrival
times (the load generator's seeded draw), the same cluster, and a timing model fitted to one such
worker by ``radixray sim calibrate --model tiny --cpu-threads 1``. Four workers share this
machine's cores, which one worker's fit does not know, so the simulator also runs with the fit
scaled by ``--contention`` (workers per core when all are busy), and with a third timing fitted
to the steps the live workers ran in this very benchmark (their ``/debug/steps`` logs, each step
costed by its whole share of the worker's time). Beside the client's TTFT the live rows show the
TTFT the workers measured inside their engines (from taking a request to its first token): what
the simulator models, without the host time of the load generator, router and HTTP around it.

Two workloads: Mooncake (completions, scale 32) and MT-Bench chats (two turns behind shared
system prompts; sessions start at Poisson arrivals, turn 2 leaves when turn 1's answer is in).
Turn 2 carries the answer the model gave live, so the chat half is replayed from the live run
itself: every request asks for ``return_token_ids``, and the simulator gets each prompt's exact
ids, each answer's exact ids (what the worker cached after turn 1) and each turn 2 as a
closed-loop request (``after`` turn 1: it arrives when the simulated turn 1 finishes). Each
policy's live run gives its own replay (answers could differ between runs).

    .venv/bin/radixray sim calibrate --model tiny --cpu-threads 1 --out /tmp/tiny_1t.json
    .venv/bin/python benchmarks/bench_sim_vs_live.py --timing /tmp/tiny_1t.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

from radixray.bench.compare import CompareConfig, run_compare
from radixray.bench.loadgen import LoadConfig, session_starts
from radixray.bench.local_cluster import WorkerSpec
from radixray.bench.workloads import build_workload
from radixray.model_meta import load_model_meta
from radixray.numbers import percentile
from radixray.sim import SimConfig, SimRequest, Workload, simulate
from radixray.sim.calibrate import fit_timing
from radixray.sim.timing import TimingModel, load_timing
from radixray.worker.scheduler import PACKINGS
from radixray.worker.stats import STEP_FIELDS

POLICIES = ("ttft", "cache_aware", "round_robin")


def chat_replay(wl, records: list[dict], rate: float, seed: int) -> Workload:
    """One live run of the chat workload as a simulator workload: exact token ids (literal
    segments), each session starting when the load generator started it, turn 2 released by
    turn 1's finish. A turn that failed live, and what followed it, is left out."""
    by_turn = {(r["session_id"], r["turn"]): r for r in records if r["ok"]}
    literal: dict[int, tuple[int, ...]] = {}
    reqs = []
    for s, t0 in zip(wl.sessions, session_starts(rate, seed), strict=False):
        prev = None
        for turn in range(len(s.turns)):
            r = by_turn.get((s.session_id, turn))
            if r is None or r.get("prompt_ids") is None:
                break
            rid = len(reqs)
            prompt, answer = 2 * rid + 1, 2 * rid + 2  # its two literal segments
            literal[prompt] = tuple(r["prompt_ids"])
            literal[answer] = tuple(r["output_ids"])
            reqs.append(
                SimRequest(
                    rid,
                    t0,
                    ((prompt, len(literal[prompt])),),
                    len(literal[answer]),
                    s.session_id,
                    output_seg=answer,
                    after=prev,
                )
            )
            prev = rid
    return Workload("mtbench_live", reqs, 0, dict(wl.meta), literal)


# The timing model's per-step and per-token costs: what workers sharing cores pay more of.
SLOWED = ("step_overhead_s", "decode_seq_s", "decode_ctx_s", "prefill_token_s", "prefill_attn_s")


def slowed(timing: TimingModel, k: float, **overrides) -> TimingModel:
    """``timing`` with every cost ``k`` times longer (workers contending for the cores)."""
    return replace(timing, **{f: getattr(timing, f) * k for f in SLOWED}, **overrides)


def sim_workload(wl, rate: float, seed: int, page_size: int, model: str) -> Workload:
    """The live workload's requests for the simulator (one completion turn per session, as the
    Mooncake workload has), arriving when the load generator sends them."""
    tok = load_model_meta(model).tokenizer
    seg_of: dict[tuple, int] = {}
    reqs = []
    starts = session_starts(rate, seed)  # the load generator's own draw
    for i, (s, t) in enumerate(zip(wl.sessions, starts, strict=False)):
        (turn,) = s.turns
        ids = tok.encode(turn.user)
        segs, parent = [], 0
        for k in range(0, len(ids), page_size):
            chunk = tuple(ids[k : k + page_size])
            seg = seg_of.setdefault((parent, chunk), len(seg_of) + 1)
            segs.append((seg, len(chunk)))
            parent = seg
        reqs.append(SimRequest(i, t, tuple(segs), turn.max_tokens, s.session_id))
    return Workload("mooncake_live", reqs, wl.sessions[0].shared_prefix_tokens, dict(wl.meta))


def fit_live_steps(report: dict, spec: WorkerSpec) -> tuple[TimingModel | None, dict]:
    """A timing model fitted to the steps the live workers ran in the benchmark itself (their
    ``/debug/steps`` logs, every policy's run pooled), each step costed by its whole share of
    the worker's time (``period_s``: scheduling, streaming out and waiting for a shared core
    included, not only the forward pass). None if the report has no step logs."""
    samples = []
    for runs in report.get("step_logs", {}).values():
        for run in runs:
            for body in (run or {}).values():
                col = {f: i for i, f in enumerate(body["fields"])}
                keep = [col[f] for f in STEP_FIELDS[:4]] + [col["period_s"]]
                samples += [tuple(x[i] for i in keep) for x in body["log"]]
    if not samples:
        return None, {}
    return fit_timing(samples, spec.max_batch_tokens, 64)  # 64: the worker's --max-running


def engine_ttfts(report: dict, target: str) -> list[float]:
    """The live run's TTFTs as the workers measured them: from the engine taking each request to
    its first token (no load generator, router, HTTP or streaming), what the simulator models."""
    out = []
    for run in report.get("step_logs", {}).get(target, []):
        for body in (run or {}).values():
            out += [x[2] for x in body.get("ttft", [])]
    return out


def run_sims(label_timings, workloads: dict[str, Workload], args, page_size: int) -> dict:
    """Each policy in the simulator on its workload, under each timing: label -> policy ->
    summary."""
    out = {}
    for label, timing in label_timings:
        sc = SimConfig(
            num_workers=args.workers,
            num_pages=args.num_pages,
            page_size=page_size,
            timing=timing,
            event_delay_s=0.25,  # the router polls its workers every 0.25 s
            packing=args.packing,
        )
        out[label] = {pol: simulate(workloads[pol], pol, sc).summary() for pol in POLICIES}
    return out


def table(live: dict, sims: dict, report: dict) -> str:
    head = "| policy | source | hit rate | TTFT p50 ms | p90 ms | p99 ms |"
    lines = [head, "|---|---|---|---|---|---|"]
    for pol in POLICIES:
        r = live[pol]
        lines.append(
            f"| {pol} | live, at the client | {r['hit_rate']:.3f} | {r['ttft_p50_s'] * 1e3:.0f} | "
            f"{r['ttft_p90_s'] * 1e3:.0f} | {r['ttft_p99_s'] * 1e3:.0f} |"
        )
        inside = engine_ttfts(report, f"radixray:{pol}")
        if inside:
            q = [percentile(inside, p) * 1e3 for p in (50, 90, 99)]
            lines.append(
                f"| {pol} | live, inside the engines | | {q[0]:.0f} | {q[1]:.0f} | {q[2]:.0f} |"
            )
        for label, res in sims.items():
            s = res[pol]
            lines.append(
                f"| {pol} | {label} | {s['hit_rate']:.3f} | {s['ttft_p50'] * 1e3:.0f} | "
                f"{s['ttft_p90'] * 1e3:.0f} | {s['ttft_p99'] * 1e3:.0f} |"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--timing", help="a timing file from `radixray sim calibrate` (required)")
    p.add_argument("--contention", type=float, default=None, help="default: workers / cores")
    p.add_argument("--workloads", nargs="+", default=["mooncake", "mtbench"])
    p.add_argument("--requests", type=int, default=300, help="Mooncake requests")
    p.add_argument("--rate", type=float, default=4.0, help="Mooncake requests per second")
    p.add_argument("--mtbench-sessions", type=int, default=80, help="two turns each")
    p.add_argument("--mtbench-rate", type=float, default=2.0, help="chat sessions per second")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument(
        "--packing", choices=PACKINGS, default=SimConfig.packing, help="the workers' (live and sim)"
    )
    p.add_argument("--num-pages", type=int, default=768)
    p.add_argument("--seed", type=int, default=0)
    # not bench_serving's 18100: the two can run side by side (pytest -n 2)
    p.add_argument("--base-port", type=int, default=18600)
    p.add_argument("--out-dir", default="/tmp/bench_sim_vs_live")
    p.add_argument("--live-json", default=None, help="reuse a live run's bench_serving.json")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: ttft only, 2 workers, 12 Mooncake requests, 2 chats; --timing "
        "defaults to benchmarks/timing_smollm2_cpu.json",
    )
    args = p.parse_args(argv)
    if args.quick:
        global POLICIES
        POLICIES = ("ttft",)
        args.workers, args.requests, args.mtbench_sessions = 2, 12, 2
        args.rate, args.mtbench_rate = 8.0, 4.0
        args.timing = args.timing or str(Path(__file__).with_name("timing_smollm2_cpu.json"))
    if not args.timing:
        p.error("--timing is required (a file from `radixray sim calibrate`)")
    unknown = set(args.workloads) - {"mooncake", "mtbench"}
    if unknown:
        p.error(f"--workloads: unknown {sorted(unknown)}; choose from mooncake, mtbench")
    page_size, model = 16, "tiny"
    kwargs = {
        "mooncake": {"limit": args.requests, "block_tokens": 16},
        "mtbench": {"num_sessions": args.mtbench_sessions},
    }
    rates = {"mooncake": args.rate, "mtbench": args.mtbench_rate}
    loads = {
        name: LoadConfig(
            mode="rate",
            rate=rates[name],
            max_requests=build_workload(name, **kwargs[name]).num_requests,
            max_duration_s=600,
            seed=args.seed,
            return_token_ids=name == "mtbench",
        )
        for name in args.workloads
    }
    spec = WorkerSpec(
        model=model,
        page_size=page_size,
        num_pages=args.num_pages,
        extra=("--packing", args.packing),
    )
    if args.live_json:
        report = json.loads(Path(args.live_json).read_text())
    else:
        cfg = CompareConfig(
            out_dir=Path(args.out_dir),
            workloads={name: kwargs[name] for name in args.workloads},
            loads=loads,
            targets=tuple(f"radixray:{x}" for x in POLICIES),
            num_workers=args.workers,
            worker=spec,
            probe_requests=3,
            command=" ".join(sys.argv),
            step_logs=True,
            base_port=args.base_port,
        )
        report = run_compare(cfg)
    solo = load_timing(args.timing)
    k = args.contention or args.workers / (os.cpu_count() or 1)
    contended = slowed(solo, k)
    results = {}
    for name in args.workloads:
        part = report["workloads"][name]
        live = {r["policy"]: r for r in part["rows"]}
        wl = build_workload(name, **kwargs[name])
        if name == "mooncake":
            one = sim_workload(wl, args.rate, args.seed, page_size, model)
            workloads = dict.fromkeys(POLICIES, one)
        else:
            workloads = {
                pol: chat_replay(wl, part["requests"][f"radixray:{pol}"], rates[name], args.seed)
                for pol in POLICIES
            }
        timings = [("sim", solo), (f"sim x{k:g}", contended)]
        live_fit, live_fit_report = fit_live_steps(part, spec)
        if live_fit is not None:
            timings.append(("sim live-fit", live_fit))
            print(
                f"{name}: live-fit timing (the live workers' own steps, all policies): "
                f"{json.dumps(live_fit.to_dict())}; {json.dumps(live_fit_report)}"
            )
        sims = run_sims(timings, workloads, args, page_size)
        n = {pol: len(w) for pol, w in workloads.items()}
        print(
            f"\n### {name}: {n} requests in the simulator (per policy), {rates[name]}/s, "
            f"{args.workers} workers x {args.num_pages} pages\n"
        )
        print(table(live, sims, part))
        results[name] = {
            "live": live,
            "sim": sims,
            "timing": {label: t.to_dict() for label, t in timings},
            "live_fit": live_fit_report,
        }
    out = Path(args.out_dir) / "sim_vs_live.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
