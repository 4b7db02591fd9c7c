"""ttft's ``choose`` with its hot path cut decides exactly as the code it replaced
(``ttft_reference.py``): random fleets (healthy or not, host tiers or none, busy or idle, some
pages unreported) and random prompts over shared prefixes, under each setting that changes the
rule's path (the margin, tier-blind, a fixed reuse weight, cache keys, a fleet of routers); two
policies of one seed on two indexes fed the same, every ``Decision`` equal field for field."""

from __future__ import annotations

import random

import pytest

from radixray.cache_index import ApproxIndex
from radixray.router.policies import RoutingRequest, WorkerState, make_policy
from radixray.router.policies.base import separating_term

from .ttft_reference import ReferenceTTFT

P = 4


def _state(rng: random.Random, wid: int) -> WorkerState:
    total = rng.choice([0, 64, 256])
    host = rng.choice([0, 0, 128])
    return WorkerState(
        wid,
        running=rng.choice([0, 0, 1, 5]),
        waiting=rng.choice([0, 0, 2]),
        queued_prefill_tokens=rng.choice([0, 37, 900]),
        free_pages=rng.randint(0, total),
        total_pages=total,
        prefill_tokens_per_s=rng.choice([500.0, 2_000.0]),
        prefill_overhead_s=rng.choice([0.0, 0.01]),
        decode_step_s=rng.choice([0.0, 0.02]),
        healthy=rng.random() > 0.15,
        load_tokens_per_s=rng.choice([0.0, 10_000.0]) if host else 0.0,
        load_overhead_s=0.001,
        max_batch_tokens=rng.choice([0, 256]),
        host_free_pages=rng.randint(0, host),
        host_total_pages=host,
        decode_seq_s=rng.choice([0.0, 0.001]),
        answer_tokens=rng.choice([0.0, 12.5, 40.0]),
    )


@pytest.mark.parametrize(
    "spec",
    ["ttft", "ttft:margin=0", "ttft:tiers=false", "ttft:reuse_weight=0.5", "ttft:memory=2"],
)
def test_choose_decides_as_the_reference(spec):
    rng = random.Random(spec)
    new, old = make_policy(spec, seed=3), ReferenceTTFT(seed=3, config=make_policy(spec).config)
    indexes = [ApproxIndex(P, max_blocks_per_worker=64) for _ in range(2)]
    prefixes = [[rng.randrange(10**6) for _ in range(8)] for _ in range(4)]
    decisions, seen = 0, set()
    for k in range(300):
        n_workers = rng.randint(1, 5)
        workers = [_state(rng, w) for w in range(n_workers)]
        if not any(w.healthy for w in workers):
            continue
        blocks = prefixes[rng.randrange(4)][: rng.randint(0, 8)] + [rng.randrange(10**6)]
        tokens = len(blocks) * P + rng.randint(-3, 3)
        fleet = rng.choice([(0, 1), (1, 3)])
        key = rng.choice([None, None, "conv-7"])
        request = RoutingRequest(f"r{k}", max(tokens, 0), blocks, arrival_time=k * 0.01,
                                 fleet=fleet, cache_key=key)  # fmt: skip
        ours, theirs = (
            p.choose(request, workers, i) for p, i in zip((new, old), indexes, strict=True)
        )
        assert ours == theirs, (spec, k)
        decisions += 1
        tier = rng.choice(["device", "host"])
        for index in indexes:
            for w in range(n_workers):
                if w not in index.workers():
                    index.add_worker(w)
            index.insert(ours.worker_id, blocks, tier=tier)
            if k % 7 == 0:  # blocks gone from a worker: the lost-blocks rate moves
                index.remove(ours.worker_id, blocks[-2:], tier=tier)
        seen.update({ours.decided_by, ours.reason})
    assert decisions > 200 and {"tie", "alone", "ttft: best match"} <= seen, seen


def test_separating_term_names_the_widest_gap_to_the_first_runner_up():
    names = ("a", "b", "c")
    terms = {"w": (1.0, 0.0, 0.0), "x": (1.0, 2.0, 2.0), "y": (1.0, 0.0, 4.0)}
    scores = {k: sum(v) for k, v in terms.items()}
    # runner-up of w: x and y both 5.0, x first (y would say c); gaps b and c both 2.0: b first
    assert separating_term("w", scores, terms, names) == "b"
    assert separating_term("w", {"w": 1.0, "x": 1.0}, terms, names) == "tie"
    assert separating_term("w", {"w": 1.0}, terms, names) == "alone"
