"""How wrong is the router's estimate of queued prefill time, by one step or by steps (issue 23)?

Runs cache_aware (a placement that does not read the estimates, so both are judged on the same
run) over the Mooncake conversation trace in the simulator, which steps the engine's own
scheduler, and compares, per request, on the worker it was sent to:

- the **wait** before its first step: admission's estimate (``queue_wait_s``) as it was, the
  queued tokens at the prefill fit (``overhead + queued / rate``), and by steps
  (``step_cost.queue_wait_seconds``), against the simulated ``wait_s``;
- its **prefill time** (TTFT on the worker): ttft's own-time term as it was (``overhead +
  (queued + uncached) / rate``, plus a decode step while the worker decodes) and by steps,
  against the simulated TTFT;
- the fleet's utilisation ``rho`` (``Headroom``) with each request's work as it was
  (``overhead + uncached / rate``) and by steps (its share of full steps), median over the
  middle half of the run; the fleet's capacity is known from the load sweep (cache_aware's
  TTFT leaves the bound between 4 and 4.5x at the cpu preset's 512-token budget).

Errors are median ratios estimate / simulated over requests that waited (wait > 10 ms).

    .venv/bin/python benchmarks/bench_sim_steps.py                       # cpu, 512-token steps
    .venv/bin/python benchmarks/bench_sim_steps.py --budget 128 --speedups 0.5,1,1.5
    .venv/bin/python benchmarks/bench_sim_steps.py --quick               # a smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import radixray.router.dispatch as dispatch
from radixray.router.policies.headroom import Headroom
from radixray.sim import SimConfig, load_mooncake, simulate, timing_preset


def measure(speedup: float, args) -> dict:
    wl = load_mooncake("mooncake", block_tokens=16, speedup=speedup, limit=args.limit, seed=0)
    timing = timing_preset("cpu", **({"max_batch_tokens": args.budget} if args.budget else {}))
    cfg = SimConfig(num_workers=args.workers, num_pages=args.pages, page_size=16, timing=timing)
    seen: dict = {}
    old_rho, new_rho = Headroom(64), Headroom(64)
    rhos: list[tuple[float, float]] = []
    original = dispatch.Dispatcher.decide

    def decide(self, request, states, attempt=1):
        decision, record = original(self, request, states, attempt)
        w = next(s for s in states if s.worker_id == decision.worker_id)
        seen[request.request_id] = w
        u = request.num_tokens - decision.predicted_cached_tokens
        n = len(states)
        now = request.arrival_time
        old_rho.observe(now, w.prefill_overhead_s + u / w.prefill_tokens_per_s, n)
        new_rho.observe(now, w.prefill_s(0, u, whole=False), n)
        rhos.append((old_rho.rho, new_rho.rho))
        return decision, record

    dispatch.Dispatcher.decide = decide
    try:
        run = simulate(wl, "cache_aware", cfg)
    finally:
        dispatch.Dispatcher.decide = original
    waits, ttfts = {"old": [], "steps": []}, {"old": [], "steps": []}
    for r in run.records:
        w = seen.get(r.rid)
        if w is None or r.cached < 0 or not r.wait_s > 0.01:
            continue
        q, own = w.queued_prefill_tokens, max(1, r.prompt_tokens - r.cached)
        old_wait = w.prefill_overhead_s + q / w.prefill_tokens_per_s if q else 0.0
        waits["old"].append(old_wait / r.wait_s)
        waits["steps"].append(w.queue_wait_s() / r.wait_s)
        old = w.prefill_overhead_s + (q + own) / w.prefill_tokens_per_s
        old += w.decode_step_s if w.running else 0.0
        ttfts["old"].append(old / r.ttft)
        ttfts["steps"].append(w.prefill_s(q, own) / r.ttft)
    mid = rhos[len(rhos) // 4 : 3 * len(rhos) // 4] or rhos
    s = run.summary()
    return {
        "speedup": speedup,
        "waited": len(waits["old"]),
        "ttft_p50": s["ttft_p50"],
        **{f"wait_{k}": statistics.median(v) for k, v in waits.items() if v},
        **{f"ttft_{k}": statistics.median(v) for k, v in ttfts.items() if v},
        "rho_old": statistics.median(a for a, _ in mid),
        "rho_steps": statistics.median(b for _, b in mid),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--speedups", default="2,3,4,4.5")
    p.add_argument("--budget", type=int, default=0, help="max_batch_tokens (0: the cpu preset's)")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--pages", type=int, default=8192)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--quick", action="store_true", help="4 x 2048, 300 requests, speedup 3")
    args = p.parse_args(argv)
    if args.quick:
        args.workers, args.pages, args.limit, args.speedups = 4, 2048, 300, "3"
    rows = [measure(float(x), args) for x in args.speedups.split(",")]
    print("| speedup | waited | TTFT p50 s | wait est/sim: one step | by steps | prefill est/sim: "
          "one step | by steps | rho: one step | by steps |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['speedup']:g} | {r['waited']} | {r['ttft_p50']:.2f} | "
            f"{r.get('wait_old', float('nan')):.2f} | {r.get('wait_steps', float('nan')):.2f} | "
            f"{r.get('ttft_old', float('nan')):.2f} | {r.get('ttft_steps', float('nan')):.2f} | "
            f"{r['rho_old']:.3f} | {r['rho_steps']:.3f} |"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
