"""Where a request's TTFT above its own bound goes, step by step, in the simulator.

Every step each simulated worker runs is logged (its start, length, the prefill chunks it
carries); then, per request, the time from arrival to first token on its worker is split into

    residual  the rest of the step that was in flight when it arrived
    queued    whole steps after its arrival that carry none of its prefill
    shared    in the steps that carry its chunks, the time beyond its own chunk on an idle
              worker (other requests' decodes and prefills in the same step)
    recompute its own prefill with the hits it got minus with the infinite cache's hits

and the four add up to TTFT minus the request's bound exactly (checked). Printed for all
requests and for the bands of requests around TTFT p50 and p90.

The step log is the simulator's ``on_step`` hook (every step a worker starts, with its batch).

    .venv/bin/python benchmarks/studies/sim_median_anatomy.py                        # 8 x 8192, cpu
    .venv/bin/python benchmarks/studies/sim_median_anatomy.py --block-tokens 512 --pages 2000 \\
        --timing gpu --speedup 1                                             # real scale
"""

from __future__ import annotations

import argparse
import bisect
import sys
from collections import defaultdict

from radixray.sim import SimConfig, load_mooncake, simulate, timing_preset
from radixray.sim.results import ttft_bound


class StepLog:
    """Every step of every simulated worker, from the simulator's ``on_step`` hook:
    worker -> [[start, length, {rid: (chunk, pos)}]] (decodes left out)."""

    def __init__(self):
        self.steps: dict[int, list[list]] = defaultdict(list)

    def __call__(self, worker_id: int, start: float, dt: float, batch) -> None:
        chunks = {
            it.req.request_id: (it.num_tokens, it.start)
            for it in batch.items
            if not (it.num_tokens == 1 and it.req.output_ids)  # not a decode
        }
        self.steps[worker_id].append([start, dt, chunks])


def anatomy(result, workload, timing, log: StepLog, page_size: int) -> list[tuple]:
    """Per request: (TTFT, TTFT - bound, residual, queued, shared, recompute)."""
    bound = dict(
        zip(
            (r.rid for r in workload.requests), ttft_bound(workload, page_size, timing), strict=True
        )
    )
    ends = {w: [s + dt for s, dt, _ in steps] for w, steps in log.steps.items()}
    out = []
    for rec in result.records:
        rid, a, f = str(rec.rid), rec.arrival, rec.first_token
        residual = queued = own = shared = 0.0
        steps = log.steps[rec.worker]
        for k in range(bisect.bisect_right(ends[rec.worker], a), len(steps)):
            start, dt, chunks = steps[k]
            if start >= f:
                break
            if start < a:
                residual += start + dt - a
            elif rid in chunks:
                c, pos = chunks[rid]
                alone = timing.step_time(0, 0, c, c * pos + c * (c - 1) // 2)
                own += alone
                shared += dt - alone
            else:
                queued += dt
        b = bound[rec.rid]
        out.append((rec.ttft, rec.ttft - b, residual, queued, shared, own - b))
    worst = max(abs(x[1] - sum(x[2:])) for x in out)
    assert worst < 1e-6, f"the parts do not add up to TTFT - bound (off by {worst:.2e} s)"
    return sorted(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--policies", default="ttft,cache_aware,kv_cost")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--pages", type=int, default=8192)
    p.add_argument("--block-tokens", type=int, default=16, help="also the page size")
    p.add_argument("--timing", default="cpu")
    p.add_argument("--speedup", type=float, default=2.5)
    p.add_argument("--limit", type=int, default=None, help="the first N requests of the trace")
    p.add_argument(
        "--quick", action="store_true", help="a smoke run: ttft on the first 200 requests"
    )
    args = p.parse_args(argv)
    if args.quick:
        args.policies, args.limit = "ttft", args.limit or 200
    P = args.block_tokens
    timing = timing_preset(args.timing)
    wl = load_mooncake("mooncake", block_tokens=P, speedup=args.speedup, limit=args.limit, seed=0)
    cfg = SimConfig(
        num_workers=args.workers,
        num_pages=args.pages,
        page_size=P,
        timing=timing,
        event_delay_s=0.05,
        seed=0,
    )
    print(
        "| policy | requests | n | TTFT s | TTFT - bound | residual | queued steps | "
        "shared steps | recompute |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for policy in args.policies.split(","):
        log = StepLog()
        result = simulate(wl, policy, cfg, on_step=log)
        parts = anatomy(result, wl, timing, log, P)
        n = len(parts)
        bands = {
            "all": parts,
            "TTFT p45-p55": parts[int(n * 0.45) : int(n * 0.55)],
            "TTFT p85-p95": parts[int(n * 0.85) : int(n * 0.95)],
        }
        for label, sel in bands.items():
            m = [sum(x[i] for x in sel) / len(sel) for i in range(6)]
            print(
                f"| {policy} | {label} | {len(sel)} | {m[0]:.3f} | {m[1]:.3f} | {m[2]:.3f} | "
                f"{m[3]:.3f} | {m[4]:.3f} | {m[5]:.3f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
