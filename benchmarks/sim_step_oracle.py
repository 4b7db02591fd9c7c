"""Would ttft's median move if the router knew exactly when each worker's step in flight ends?

ttft charges a decoding worker one average decode step (``decode_step_s``) for the step a new
request waits behind, and counts the prefill chunk in flight as still queued. Both are guesses
a worker could replace with facts (it knows its batch and its own step-cost fit). This runs
ttft with an oracle that reads every simulated worker directly at each arrival and hands ttft's
unchanged cost formula the exact rest of the step in flight (plus ``--decode-share`` of a decode
step for the decodes its own steps will carry), with the chunk in flight taken out of the
queued prefill. If the oracle does not move ttft's excess over the bound, a worker reporting its
step phase would not either: what is left at the median is not missing information.

    .venv/bin/python benchmarks/sim_step_oracle.py [--seeds 4] [--cells 8x8192,16x2048]
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--cells", default="8x8192,16x2048", help="WORKERSxPAGES, comma-separated")
    p.add_argument("--decode-shares", default="0,0.5,1", help="comma-separated")
    p.add_argument("--timing", default="cpu")
    p.add_argument("--speedup-per-8", type=float, default=2.5)
    args = p.parse_args(argv)
    shares = [float(x) for x in args.decode_shares.split(",")]
    print(
        "| cell | policy | hit (median) | excess p50 by seed | excess p99 by seed "
        "| median p50 | median p99 |"
    )
    print("|---|---|---|---|---|---|---|")
    for cell in args.cells.split(","):
        workers, pages = (int(x) for x in cell.split("x"))
        wl = load_mooncake(
            "mooncake", block_tokens=16, speedup=args.speedup_per_8 * workers / 8, seed=0
        )
        for share in [None, *shares]:
            rows = []
            for seed in range(args.seeds):
                cfg = SimConfig(
                    num_workers=workers,
                    num_pages=pages,
                    page_size=16,
                    timing=timing_preset(args.timing),
                    event_delay_s=0.05,
                    seed=seed,
                )
                clock = StepClock()
                pol = (
                    make_policy("ttft", seed=seed)
                    if share is None
                    else StepOracle(clock, seed, share)
                )
                rows.append(simulate(wl, pol, cfg, on_step=clock).summary())
            name = "ttft" if share is None else f"ttft + step oracle, decode share {share:g}"
            p50 = [s["excess_p50"] for s in rows]
            p99 = [s["excess_p99"] for s in rows]
            hit = statistics.median(s["hit_rate"] for s in rows)
            print(
                f"| {cell} | {name} | {hit:.3f} | {' / '.join(f'{x:.3f}' for x in p50)} | "
                f"{' / '.join(f'{x:.3f}' for x in p99)} | {statistics.median(p50):.3f} | "
                f"{statistics.median(p99):.3f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
