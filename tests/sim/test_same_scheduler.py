"""The simulator schedules as the engine does: one script of arrivals drives a real engine (tiny
model) and a simulated worker step by step; their steps, admissions, preemptions and cached
tokens are the same. Both run the engine's ``Scheduler``; this checks everything around it (how
the simulator feeds arrivals, samples, finishes and reports)."""

from __future__ import annotations

import random

import pytest

from radixray.protocol import SamplingParams
from radixray.sim.sim_worker import SimWorker
from radixray.sim.timing import TimingModel
from radixray.sim.workload import SimRequest, Workload
from radixray.worker import Engine, EngineConfig

P, PAGES, BATCH, RUNNING = 4, 20, 24, 3


def script(seed: int = 0) -> tuple[Workload, dict[int, list[SimRequest]]]:
    """14 requests over ~40 steps: most share a 20-token system prompt, some repeat an earlier
    question (a deeper hit), outputs long enough that running requests outgrow a
    pool of 20 pages and preempt each other."""
    rng = random.Random(seed)
    reqs, arrivals = [], {}
    step = 0
    for i in range(14):
        step += rng.choice((0, 1, 2, 3))
        system = ((-1, 20),) if rng.random() < 0.75 else ((-2, 12),)
        question = (i if i < 3 or rng.random() < 0.7 else rng.randrange(3), 4 + (i * 7) % 13)
        # a distinct last token: a repeated question may hit deep, but no two prompts are
        # equal (the engine's greedy answers to equal prompts would be equal, and a request
        # resumed after preemption would then hit the other's answer: text the simulator
        # cannot know)
        tail = (1000 + i, 1)
        req = SimRequest(i, float(step), (*system, question, tail), 6 + (i * 5) % 17)
        reqs.append(req)
        arrivals.setdefault(step, []).append(req)
    return Workload("script", reqs, 20), arrivals


def costs(decodes: int) -> tuple[float, float]:
    """What priced packing weighs, the same for both (each would otherwise fit its own: the
    engine its measured steps, the simulator its timing model's): a step's fixed cost, and a
    prefill token's, which caps a step that finishes a prompt at 5 more tokens a waiting one."""
    return 0.01 + 0.001 * decodes, 0.002


@pytest.mark.parametrize("packing", ["priced", "full"])
@pytest.mark.parametrize("order", ["fcfs", "shortest", "ratio"])
def test_the_simulator_and_the_engine_run_the_same_steps(order, packing):
    wl, arrivals = script()
    hashes = dict(zip((r.rid for r in wl.requests), wl.block_hashes(P), strict=True))
    engine = Engine(
        EngineConfig(model="tiny", page_size=P, num_pages=PAGES, max_batch_tokens=BATCH,
                     max_running=RUNNING, enable_events=False, prefill_order=order,
                     packing=packing)
    )  # fmt: skip
    timing = TimingModel(0.01, 0.001, 0.0, 0.002, 0.0, BATCH, RUNNING)
    cached = {"engine": {}, "sim": {}}
    first = {"engine": {}, "sim": {}}  # request -> the step that gave its first token
    done = {"engine": {}, "sim": {}}  # ... and its last

    def sim_first(req, n, now):  # a step k ends at time k + 1
        cached["sim"][req.rid] = n
        first["sim"][req.rid] = int(now) - 1

    def sim_done(req, n, now):
        done["sim"][req.rid] = int(now) - 1

    sim = SimWorker(
        0, PAGES, P, timing, wl, on_first_token=sim_first, on_finish=sim_done,
        prefill_order=order, packing=packing,
    )  # fmt: skip
    engine.scheduler.step_costs = sim.scheduler.step_costs = costs
    now = [0]  # the engine's step

    def sink(rid: int):
        def take(chunk):
            first["engine"].setdefault(rid, now[0])
            if chunk.finish_reason is not None:
                done["engine"][rid] = now[0]

        return take

    try:
        assert max(wl.tokens(r)[-1] for r in wl.requests) < engine.model_config.vocab_size
        last = max(arrivals)
        engine_steps, sim_steps = [], []
        for r in arrivals.get(0, []):
            sim.enqueue(r, hashes[r.rid], 0.0)
        k = 0
        while k <= last or engine.scheduler.has_work():
            for r in arrivals.get(k, []):
                params = SamplingParams(max_tokens=r.output_len, ignore_eos=True)
                engine.add(engine.requests.build(wl.tokens(r), params, str(r.rid)), sink(r.rid))
            engine.meter.step_log.clear()
            now[0] = k
            engine.step()
            engine_steps += [s[:4] for s in engine.meter.step_log]
            # the simulated worker's step k, if it has one, is under way: the next step's
            # arrivals come in during it, then it ends and schedules step k + 1 with them (an
            # idle worker starts step k + 1 as they arrive)
            in_step = sim.busy
            if in_step:
                sim_steps.append(tuple(sim._batch.shape()))
            for r in arrivals.get(k + 1, []):
                sim.enqueue(r, hashes[r.rid], float(k + 1))
            if in_step:
                sim.step_end(float(k + 1))
            for req in list(engine._live.values()):
                if req.req.miss is not None:
                    cached["engine"][int(req.req.request_id)] = req.req.cached_tokens
            k += 1
            assert k < 500
        assert engine_steps == sim_steps
        assert first["engine"] == first["sim"] and done["engine"] == done["sim"]
        assert len(done["sim"]) == len(wl)
        assert engine.scheduler.num_preemptions == sim.scheduler.num_preemptions > 0
        assert cached["engine"] == cached["sim"] and len(cached["sim"]) == len(wl)
        assert sum(cached["sim"].values()) > 0
        engine.scheduler.check_integrity()
        sim.check_integrity()
    finally:
        engine.shutdown()
