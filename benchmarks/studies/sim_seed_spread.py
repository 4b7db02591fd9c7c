"""How much of a simulated comparison is the seed: the same cells with the simulator's and the
policies' seeds 0..N-1 (tie-breaks, kv_cost's and ttft's random choices). bench_sim.py reports
seed 0; a ratio between two policies is only as good as its spread over seeds, so a variant of a
policy is judged here (``--policies ttft,kv_cost,ttft:margin=0``).

    .venv/bin/python benchmarks/studies/sim_seed_spread.py \\
        [--seeds 4] [--policies ttft,cache_aware,kv_cost]

**The step oracle** (``--policies ttft,step_oracle:0,step_oracle:0.5``): would ttft's median
move if the router knew exactly when each worker's step in flight ends? ttft charges a decoding
worker one average decode step (``decode_step_s``) for the step a new request waits behind,
and counts the prefill chunk in flight as still queued. Both are guesses a worker could replace
with facts (it knows its batch and its own step-cost fit). ``step_oracle:SHARE`` runs ttft with
an oracle that reads every simulated worker's step (the simulator's ``on_step`` hook) and hands
ttft's unchanged cost formula the exact rest of the step in flight, plus SHARE of a decode step
for the decodes its own steps will carry, with the chunk in flight taken out of the queued
prefill. If it does not move ttft's excess over the bound, a worker reporting its step phase
would not either.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys

from radixray.router.policies import Policy, make_policy
from radixray.sim import SimConfig, load_mooncake, simulate, timing_preset


class StepClock:
    """When each simulated worker's step in flight ends, and what it carries: the simulator's
    ``on_step`` hook."""

    def __init__(self):
        self.steps: dict[int, tuple[float, object]] = {}  # worker -> (end, batch)

    def __call__(self, worker_id: int, start: float, dt: float, batch) -> None:
        self.steps[worker_id] = (start + dt, batch)

    def exact(self, state, now: float, decode_share: float):
        """``state`` with the step in flight as it really is."""
        end, batch = self.steps.get(state.worker_id, (0.0, None))
        if end <= now:  # idle: its last step is over and it started no other
            return state
        in_flight = sum(it.num_tokens for it in batch.items if it.req.in_prefill)
        return dataclasses.replace(
            state,
            queued_prefill_tokens=max(0, state.queued_prefill_tokens - in_flight),
            decode_step_s=end - now + decode_share * state.decode_step_s,
        )


class StepOracle(Policy):
    """ttft's own choice over the exact step phase of every worker (an experiment, not a policy
    a live router has: it reads the simulated workers)."""

    name = "ttft+step_oracle"

    def __init__(self, clock: StepClock, seed: int, decode_share: float):
        super().__init__(seed)
        self.clock, self.decode_share = clock, decode_share
        self.inner = make_policy("ttft", seed=seed)
        self.name = f"ttft+step_oracle(decode_share={decode_share:g})"

    def choose(self, request, workers, index):
        now = request.arrival_time
        exact = [self.clock.exact(w, now, self.decode_share) for w in workers]
        return self.inner.choose(request, exact, index)

    def on_dispatch(self, decision, request):
        self.inner.on_dispatch(decision, request)

    def on_complete(self, request_id, worker_id, cached_tokens):
        self.inner.on_complete(request_id, worker_id, cached_tokens)


def build(spec: str, seed: int):
    """A policy by spec, or the step oracle; with the ``on_step`` hook it needs (or None)."""
    if spec.startswith("step_oracle:"):
        clock = StepClock()
        return StepOracle(clock, seed, float(spec.split(":", 1)[1])), clock
    return make_policy(spec, seed=seed), None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--cells", default="8x8192,16x2048", help="WORKERSxPAGES, comma-separated")
    p.add_argument("--policies", default="ttft,cache_aware,kv_cost")
    p.add_argument("--timing", default="cpu")
    p.add_argument("--speedup-per-8", type=float, default=2.5)
    p.add_argument("--limit", type=int, default=None, help="the first N requests of the trace")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 2 seeds, 8x8192, ttft and cache_aware, the first 200 requests",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.cells, args.policies = 2, "8x8192", "ttft,cache_aware"
        args.limit = args.limit or 200
    policies = args.policies.split(",")
    print(
        "| cell | policy | hit (median) | excess p50 by seed | excess p99 by seed | median p50 "
        "| median p99 |"
    )
    print("|---|---|---|---|---|---|---|")
    for cell in args.cells.split(","):
        workers, pages = (int(x) for x in cell.split("x"))
        speedup = args.speedup_per_8 * workers / 8
        wl = load_mooncake("mooncake", block_tokens=16, speedup=speedup, limit=args.limit, seed=0)
        runs: dict[str, list[dict]] = {}
        for pol in policies:
            runs[pol] = []
            for seed in range(args.seeds):
                cfg = SimConfig(
                    num_workers=workers,
                    num_pages=pages,
                    page_size=16,
                    timing=timing_preset(args.timing),
                    event_delay_s=0.05,
                    seed=seed,
                )
                policy, on_step = build(pol, seed)
                runs[pol].append(simulate(wl, policy, cfg, on_step=on_step).summary())
            p50 = [s["excess_p50"] for s in runs[pol]]
            p99 = [s["excess_p99"] for s in runs[pol]]
            hit = statistics.median(s["hit_rate"] for s in runs[pol])
            print(
                f"| {cell} | {pol} | {hit:.3f} | {' / '.join(f'{x:.3f}' for x in p50)} | "
                f"{' / '.join(f'{x:.3f}' for x in p99)} | {statistics.median(p50):.3f} | "
                f"{statistics.median(p99):.3f} |",
                flush=True,
            )
        # ttft against the other policies, not against its own variants
        baselines = [b for b in runs if not b.startswith(("ttft", "step_oracle"))]
        if "ttft" in runs and baselines:
            for q in ("excess_p50", "excess_p99"):
                per_seed = [
                    runs["ttft"][k][q] / min(runs[b][k][q] for b in runs if b in baselines)
                    for k in range(args.seeds)
                ]
                print(
                    f"| {cell} | ttft / best other, {q} | | "
                    f"{' / '.join(f'x{r:.2f}' for r in per_seed)} | | "
                    f"median x{statistics.median(per_seed):.2f} | |"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
