"""The router's CPU per routing decision, in process: a policy's ``choose`` and the bookkeeping the
router does around it for every request.

    .venv/bin/python benchmarks/bench_policy_cpu.py                      # ttft, cache_aware; 2, 8
    .venv/bin/python benchmarks/bench_policy_cpu.py --policies ttft:margin=0,ttft --workers 4
    .venv/bin/python benchmarks/bench_policy_cpu.py --quick              # a smoke run (seconds)

``bench_router.py`` measures the whole router process against SGLang's; this isolates the part a
policy change moves. Three figures per policy spec and fleet size, each microseconds per request,
the median of ``--repeats`` runs of ``--requests`` requests (the runs interleaved policy by policy,
as the machine is shared and noisy):

- choose: ``policy.choose`` alone (its index match included);
- choose + insert: ``policy.choose``, the index entry of the request's blocks on the chosen worker
  and ``policy.on_dispatch`` / ``on_complete`` (what benchmarks/HISTORY.md's "Remeasured
  2026-12-04" timed for ttft: 23 us there, 5 us ~450 commits earlier);
- decide: the same through the router's ``Dispatcher.decide``, which adds the decision record and
  the herding alarm (the live router's default window of 64).

Two prompt shapes (``--prompts``), page size 16, the block hashes computed before the timed loop
(the router hashes a prompt once, on arrival, outside the policy):

- chat: prompts sharing prefixes as chat traffic does. ``--systems`` system prompts of
512-2,048 tokens, picked with Zipf(1.1) popularity, open conversations; each later request
continues one of the open conversations (its whole history, the last answer and a new user turn
of 32-512 tokens) or, with probability 0.3, starts a new one; a prompt past 8,192 tokens is cut
there, sent, and its conversation closed (~2,300 tokens on average: the index's walk of the
prompt is much of a decision). The workers have host tiers.
- router: ``bench_router.py``'s, 8 shared 256-token prefixes and a unique 24-token suffix each,
  answers of 1-64 tokens, no host tiers: where the policy's own arithmetic is most of it.

The workers, outside the timed region: each serves its requests first come first served, its
prefill at 20,000 tokens/s plus 10 ms a request, then 16-128 answer tokens at 10 ms a step (at
most 32 at once); arrivals come at about 70% of the fleet's prefill capacity (with 80% of each
prompt cached), so queues form and drain. They report what the live router's worker pool passes
on (running, waiting, queued prefill, free pages of 4,096, a host tier of 16,384 pages with its
load-back rate, the step budget, the decode costs), and with host tiers the index learns
demotions: blocks past a worker's device pages move to its host tier.

Printed per case: a digest of the workers chosen (equal digests: the same decisions, e.g. before
and after a change to a policy's code that must not change what it decides).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import platform
import random
import statistics
import sys
import time
from collections import OrderedDict, deque
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from radixray.cache_index import ApproxIndex, hash_blocks  # noqa: E402
from radixray.router.dispatch import Dispatcher  # noqa: E402
from radixray.router.policies import RoutingRequest, WorkerState, make_policy  # noqa: E402

P = 16
DEVICE_PAGES, HOST_PAGES = 4096, 16384
PREFILL_RATE, PREFILL_OVERHEAD, STEP_S = 20_000.0, 0.010, 0.010
MAX_BATCH_TOKENS, MAX_RUNNING = 2048, 32
LOAD = 0.7  # offered prefill work over the fleet's capacity, at 80% of each prompt cached


def workload(kind: str, n: int, systems: int, seed: int) -> list[tuple[int, list[int], int]]:
    """``n`` requests of the shape ``kind``: (prompt tokens, block hashes, answer tokens)."""
    rng = random.Random(seed)
    vocab = 32_000
    if kind == "router":
        prefixes = [[rng.randrange(vocab) for _ in range(256)] for _ in range(8)]
        prompts = [prefixes[i % 8] + [rng.randrange(vocab) for _ in range(24)] for i in range(n)]
        return [(len(t), hash_blocks(t, P), rng.randint(1, 64)) for t in prompts]
    sys_prompts = [
        [rng.randrange(vocab) for _ in range(rng.randint(512, 2048))] for _ in range(systems)
    ]
    weights = [1.0 / (k + 1) ** 1.1 for k in range(systems)]
    open_convs: list[list[int]] = []
    out = []
    for _ in range(n):
        if not open_convs or rng.random() < 0.3:
            conv = list(rng.choices(sys_prompts, weights)[0])
            open_convs.append(conv)
            if len(open_convs) > 64:
                open_convs.pop(0)
        else:
            conv = rng.choice(open_convs)
            conv += [rng.randrange(vocab) for _ in range(rng.randint(32, 256))]  # the answer
        conv += [rng.randrange(vocab) for _ in range(rng.randint(32, 512))]  # the user turn
        if len(conv) > 8192:
            open_convs.remove(conv)
            conv = conv[:8192]
        out.append((len(conv), hash_blocks(conv, P), rng.randint(16, 128)))
    return out


class Worker:
    """One worker's FIFO queue in seconds, and its device pages as an LRU of block hashes."""

    def __init__(self, wid: str, host: bool):
        self.wid = wid
        self.host = host
        self.busy_until = 0.0  # when its prefill queue empties
        self.inflight: deque[tuple[float, float, int]] = deque()  # (prefill start, end, tokens)
        self.done: list[tuple[float, str]] = []  # (finish time, request id)
        self.device: OrderedDict[int, None] = OrderedDict()

    def state(self, now: float) -> WorkerState:
        while self.inflight and self.inflight[0][1] <= now:
            self.inflight.popleft()
        self.done = [d for d in self.done if d[0] > now]
        waiting = sum(1 for start, _, _ in self.inflight if start > now)
        queued = 0.0
        for start, end, tokens in self.inflight:
            queued += tokens if start > now else tokens * (end - now) / (end - start)
        host = {
            "load_tokens_per_s": 4 * PREFILL_RATE,
            "load_overhead_s": 0.002,
            "host_free_pages": HOST_PAGES // 4,
            "host_total_pages": HOST_PAGES,
        }
        return WorkerState(
            worker_id=self.wid,
            running=min(MAX_RUNNING, len(self.done) - waiting),
            waiting=waiting + max(0, len(self.done) - waiting - MAX_RUNNING),
            queued_prefill_tokens=int(queued),
            free_pages=max(0, DEVICE_PAGES - len(self.device)),
            total_pages=DEVICE_PAGES,
            prefill_tokens_per_s=PREFILL_RATE,
            prefill_overhead_s=PREFILL_OVERHEAD,
            decode_step_s=STEP_S,
            max_batch_tokens=MAX_BATCH_TOKENS,
            decode_seq_s=0.0002,
            answer_tokens=72.0,
            **(host if self.host else {}),
        )

    def serve(self, rid: str, now: float, uncached: int, answer: int) -> float:
        """Queue a request; returns when it finishes."""
        start = max(now, self.busy_until)
        end = start + PREFILL_OVERHEAD + uncached / PREFILL_RATE
        self.busy_until = end
        self.inflight.append((start, end, uncached))
        self.done.append((end + answer * STEP_S, rid))
        return end + answer * STEP_S

    def store(self, index: ApproxIndex, hashes: list[int]) -> None:
        """The blocks a request leaves on the device; those past its pages go to its host tier
        (or are lost without one)."""
        for h in reversed(hashes):
            self.device[h] = None
            self.device.move_to_end(h)
        demoted = []
        while len(self.device) > DEVICE_PAGES:
            demoted.append(self.device.popitem(last=False)[0])
        if demoted:
            index.remove(self.wid, demoted)
        if demoted and self.host:
            index.insert(self.wid, demoted[::-1], tier="host")


def run(spec: str, workers: int, requests: list, host: bool, decide: bool, seed: int) -> tuple:
    """One run: (us per request in ``choose``, in all, a digest of the workers chosen)."""
    policy = make_policy(spec, seed=seed)
    index = ApproxIndex(P, max_blocks_per_worker=HOST_PAGES)
    dispatch = Dispatcher(policy, index, herd_window=64)
    fleet = {f"w{k}": Worker(f"w{k}", host) for k in range(workers)}
    for wid in fleet:
        index.add_worker(wid)
    mean_work = statistics.fmean(PREFILL_OVERHEAD + 0.2 * n / PREFILL_RATE for n, _, _ in requests)
    rng = random.Random(seed)
    now, spent, choosing, chosen = 0.0, 0, 0, []
    finishing: list[tuple[float, str, str, int]] = []
    clock = time.thread_time_ns  # CPU time: the machine may be shared
    gc.collect()
    for k, (n, hashes, answer) in enumerate(requests):
        now += rng.expovariate(LOAD * workers / mean_work)
        states = [w.state(now) for w in fleet.values()]
        ended = [f for f in finishing if f[0] <= now]
        finishing = [f for f in finishing if f[0] > now]
        request = RoutingRequest(f"r{k}", n, hashes, arrival_time=now)
        t0 = clock()
        for _, rid, wid, cached in ended:
            policy.on_complete(rid, wid, cached)
        if decide:
            decision, _ = dispatch.decide(request, states)
        else:
            t1 = clock()
            decision = policy.choose(request, states, index)
            choosing += clock() - t1
            index.insert(decision.worker_id, hashes)
            policy.on_dispatch(decision, request)
        spent += clock() - t0
        wid, cached = decision.worker_id, decision.predicted_cached_tokens
        chosen.append(wid)
        done = fleet[wid].serve(request.request_id, now, n - cached, answer)
        finishing.append((done, request.request_id, wid, cached))
        fleet[wid].store(index, hashes)
    digest = hashlib.sha256(",".join(chosen).encode()).hexdigest()[:10]
    return choosing / 1000 / len(requests), spent / 1000 / len(requests), digest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policies", default="ttft,cache_aware", help="comma-separated policy specs")
    ap.add_argument("--workers", default="2,8", help="comma-separated fleet sizes")
    ap.add_argument("--prompts", default="chat,router", help="prompt shapes: chat, router")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--systems", type=int, default=16, help="distinct system prompts (chat)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="a smoke run: 200 requests, 2 repeats")
    args = ap.parse_args()
    if args.quick:
        args.requests, args.repeats = 200, 2
    specs = [s for s in args.policies.split(",") if s]
    sizes = [int(s) for s in args.workers.split(",") if s]
    shapes = [s for s in args.prompts.split(",") if s]
    if set(shapes) - {"chat", "router"}:
        ap.error(f"--prompts: chat or router, got {args.prompts!r}")
    requests = {k: workload(k, args.requests, args.systems, args.seed) for k in shapes}
    mean_n = {k: statistics.fmean(n for n, _, _ in reqs) for k, reqs in requests.items()}
    print(
        f"{args.requests} requests a run, {args.repeats} runs; mean prompt "
        + ", ".join(f"{k} {mean_n[k]:.0f} tokens" for k in shapes)
        + f"; Python {platform.python_version()}, {platform.machine()}"
    )
    cases = [(k, s, w, d) for k in shapes for w in sizes for s in specs for d in (False, True)]
    times: dict[tuple, list[tuple[float, float]]] = {c: [] for c in cases}
    digests: dict[tuple, set[str]] = {c: set() for c in cases}
    with tqdm(total=len(cases) * args.repeats, desc="runs", file=sys.stderr) as bar:
        for _ in range(args.repeats):
            for case in cases:
                kind, spec, w, decide = case
                out = run(spec, w, requests[kind], kind == "chat", decide, args.seed)
                times[case].append(out[:2])
                digests[case].add(out[2])
                bar.update()
    print(
        "\n| prompts | policy | workers | choose (us/request) | choose + insert (us/request) "
        "| runs | decide (us/request) | runs | workers chosen (digest) |"
    )
    print("|---|---|---:|---:|---:|---|---:|---|---|")
    for kind, spec, w, _ in cases[::2]:
        bare = [t for _, t in times[(kind, spec, w, False)]]
        alone = statistics.median(c for c, _ in times[(kind, spec, w, False)])
        full = [t for _, t in times[(kind, spec, w, True)]]
        seen = digests[(kind, spec, w, False)] | digests[(kind, spec, w, True)]
        print(
            f"| {kind} | {spec} | {w} | {alone:.1f} | {statistics.median(bare):.1f} | "
            f"{_runs(bare)} | {statistics.median(full):.1f} | {_runs(full)} | "
            f"{', '.join(sorted(seen))} |"
        )


def _runs(times: list[float]) -> str:
    return ", ".join(f"{t:.1f}" for t in times)


if __name__ == "__main__":
    main()
