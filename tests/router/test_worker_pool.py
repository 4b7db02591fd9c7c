"""WorkerPool load accounting: own traffic now + other routers' traffic from the last report."""

import asyncio

from radixray.cache_index import ApproxIndex
from radixray.protocol import (
    GenerateRequest,
    LoadReport,
    LocalTransport,
    SamplingParams,
    WorkerClient,
    WorkerInfo,
)
from radixray.router.worker_pool import WorkerEntry, WorkerPool
from radixray.step_cost import StepCostModel
from radixray.worker import WorkerHost

from .serving import StepGate


def info(wid: str, perf_class: str = "") -> WorkerInfo:
    return WorkerInfo(wid, "epoch", "tiny", 4, 4096, 320, "radix", 64, "cpu", perf_class)


def entry(wid: str, perf_class: str = "", **report) -> WorkerEntry:
    return WorkerEntry(None, wid, info(wid, perf_class), LoadReport(**report))


def pool_with(report: dict, own_at_report: dict | None = None) -> tuple[WorkerPool, WorkerEntry]:
    pool = WorkerPool(ApproxIndex(4))
    e = entry("w", **report)
    e.traffic.at_report = own_at_report or {}
    pool.workers["w"] = e
    return pool, e


def test_a_request_that_finished_after_the_report_no_longer_counts():
    # The report was taken while our request was prefilling; it has finished since.
    pool, e = pool_with(
        {"running": 0, "waiting": 1, "queued_prefill_tokens": 100, "prefill_tokens_per_s": 50.0},
        {"running": 0, "waiting": 1, "queued_prefill_tokens": 100, "active_decode_tokens": 0},
    )
    (s,) = pool.states()
    assert (s.waiting, s.running, s.queued_prefill_tokens) == (0, 0, 0)
    assert s.prefill_tokens_per_s == 50.0


def test_other_routers_traffic_is_added_to_ours():
    pool, e = pool_with(
        {"running": 3, "waiting": 2, "queued_prefill_tokens": 700, "active_decode_tokens": 90},
        {"running": 1, "waiting": 0},
    )
    e.traffic.dispatch("r1", uncached=40, context=60)
    e.traffic.dispatch("r2", uncached=10, context=20)
    e.traffic.first_token("r2")
    (s,) = pool.states()
    # ours now: 1 waiting (40 uncached), 1 running (20 context); others: 2 running, 2 waiting.
    assert (s.running, s.waiting) == (1 + 2, 1 + 2)
    assert s.queued_prefill_tokens == 40 + 700
    assert s.active_decode_tokens == 20 + 90
    e.traffic.finish("r1")
    e.traffic.finish("r2")
    (s,) = pool.states()
    assert (s.running, s.waiting, s.queued_prefill_tokens) == (2, 2, 700)


def test_unmeasured_rate_borrows_the_mean_of_measured_workers():
    pool = WorkerPool(ApproxIndex(4))
    for wid, rate in (("a", 100.0), ("b", 300.0), ("c", None)):
        pool.workers[wid] = entry(wid, prefill_tokens_per_s=rate)
    rates = {s.worker_id: s.prefill_tokens_per_s for s in pool.states()}
    assert rates == {"a": 100.0, "b": 300.0, "c": 200.0}


def test_down_and_draining_workers_are_not_routable():
    pool = WorkerPool(ApproxIndex(4))
    for wid in ("a", "b", "c"):
        pool.workers[wid] = entry(wid)
        pool.index.add_worker(wid)
    pool.index.insert("b", [1, 2, 3])
    pool.mark_down("b", "test")
    pool.workers["c"].draining = True
    assert pool.routable() == ["a"]
    assert pool.index.num_blocks("b") == 0


def test_workers_of_one_perf_class_share_one_prefill_fit():
    # Same hardware (4000 tok/s + 50 ms a step), different prompt mixes: alone, "a" and "b" would
    # report ratios 2.5x apart; "c" runs elsewhere and keeps its own; "d" reports no moments.
    pool = WorkerPool(ApproxIndex(4))
    for wid, cls, steps in (
        ("a", "gpu-x", [(100, 0.05 + 100 / 4000.0)] * 8),
        ("b", "gpu-x", [(1000, 0.05 + 1000 / 4000.0)] * 8),
        ("c", "gpu-y", [(t, 0.01 + t / 9000.0) for t in (50, 400, 900, 120) * 3]),
    ):
        model = StepCostModel()
        for tokens, seconds in steps:
            model.update(tokens, seconds)
        overhead, rate = model.fit()
        pool.workers[wid] = entry(
            wid,
            cls,
            prefill_fit_moments=tuple(model.moments),
            prefill_overhead_s=overhead,
            prefill_tokens_per_s=rate,
        )
    pool.workers["d"] = entry("d", prefill_tokens_per_s=777.0, prefill_overhead_s=0.002)
    fits = {s.worker_id: (s.prefill_overhead_s, s.prefill_tokens_per_s) for s in pool.states()}
    assert fits["a"] == fits["b"]
    assert abs(fits["a"][0] - 0.05) < 1e-9 and abs(fits["a"][1] - 4000.0) < 1e-6
    assert abs(fits["c"][0] - 0.01) < 1e-9 and abs(fits["c"][1] - 9000.0) < 1e-6
    assert fits["d"] == (0.002, 777.0)


def test_workers_of_one_perf_class_share_one_decode_cost_and_report_their_answers():
    # "a" only ever decoded 1 sequence a step and "b" 8 (20 ms + 3 ms a sequence): pooled, both
    # price a sequence at 3 ms; "c" (another class, one batch size) borrows that mean. Answer
    # lengths stay each worker's own (0: none ended there yet).
    pool = WorkerPool(ApproxIndex(4))
    for wid, cls, batch, answer in (("a", "x", 1, 12.0), ("b", "x", 8, 30.0), ("c", "y", 4, None)):
        model = StepCostModel()
        for _ in range(5):
            model.update(batch, 0.02 + 0.003 * batch)
        pool.workers[wid] = entry(
            wid, cls, decode_fit_moments=tuple(model.moments), answer_tokens=answer
        )
    states = {s.worker_id: s for s in pool.states()}
    assert abs(states["a"].decode_seq_s - 0.003) < 1e-9
    assert states["a"].decode_seq_s == states["b"].decode_seq_s == states["c"].decode_seq_s
    assert [states[w].answer_tokens for w in "abc"] == [12.0, 30.0, 0.0]


# The polls below are held open by the test for as long as it needs; the pool's own timeout (2 s)
# would end one early on a loaded machine, and its report would be lost.
HELD_POLL_TIMEOUT_S = 600.0


class GatedClient(WorkerClient):
    """A real in-process worker whose poll the test holds before the worker takes its report
    and again before the reply arrives, to place requests inside the poll's window."""

    def __init__(self, host):
        super().__init__(LocalTransport(host), host.worker_id)
        self.before_report = asyncio.Event()
        self.before_reply = asyncio.Event()
        self.reported = asyncio.Event()

    async def poll(self, since_seq, epoch, router_id=None):
        await self.before_report.wait()
        resp = await super().poll(since_seq, epoch, router_id)
        self.reported.set()
        await self.before_reply.wait()
        return resp


def test_a_request_that_lived_only_inside_the_poll_window_is_not_phantom_load():
    # Poll sent (our tally 0) -> request dispatched -> worker reports it running -> it finishes
    # -> reply arrives (tally 0 again). The report's running=1 was ours, not another router's.
    host = WorkerHost({"model": "tiny", "page_size": 4}, "w0")
    gate = StepGate(host)  # the request runs its prefill, then waits for the report

    async def scenario():
        pool = WorkerPool(ApproxIndex(4), poll_timeout_s=HELD_POLL_TIMEOUT_S)
        client = GatedClient(host)
        client.before_report.set()
        client.before_reply.set()
        await pool.add(client)
        client.before_report.clear()
        client.before_reply.clear()
        poll = asyncio.ensure_future(pool.poll_once())
        await asyncio.sleep(0)
        tally = pool.workers["w0"].traffic
        tally.dispatch("r1", uncached=9, context=9)
        stream = host.generate(
            GenerateRequest("r1", list(range(9)), SamplingParams(max_tokens=200, ignore_eos=True))
        )
        first = await anext(stream)
        tally.first_token("r1")
        tally.tokens("r1", len(first.token_ids))
        client.reported.clear()
        client.before_report.set()
        await client.reported.wait()  # the report is taken while the gate holds r1 running
        gate.release()
        async for chunk in stream:  # the router counts each streamed token as context
            tally.tokens("r1", len(chunk.token_ids))
        tally.finish("r1")
        client.before_reply.set()
        await poll
        entry = pool.workers["w0"]
        assert entry.report.running == 1  # the report did count it
        # What the router pools prefill fits by, and the moments it pools.
        assert entry.info.perf_class.startswith("tiny | float32 | ")
        assert entry.report.prefill_fit_moments[0] > 0
        (s,) = pool.states()
        return s.running, s.waiting, s.active_decode_tokens

    try:
        assert asyncio.run(scenario()) == (0, 0, 0)
    finally:
        gate.release()
        host.shutdown()


class QueuedPollClient(WorkerClient):
    """A real in-process worker whose polls each wait for their own release, so the test
    decides the order in which overlapping polls (one asked for during a round) finish."""

    def __init__(self, host):
        super().__init__(LocalTransport(host), host.worker_id)
        self.gates: list[asyncio.Event] = []
        self.hold = False

    async def poll(self, since_seq, epoch, router_id=None):
        if self.hold:
            gate = asyncio.Event()
            self.gates.append(gate)
            await gate.wait()
        return await super().poll(since_seq, epoch, router_id)


def test_overlapping_polls_finishing_in_reverse_order_keep_their_own_peaks():
    host = WorkerHost({"model": "tiny", "page_size": 4}, "w0")

    async def scenario():
        pool = WorkerPool(ApproxIndex(4), poll_timeout_s=HELD_POLL_TIMEOUT_S)
        client = QueuedPollClient(host)
        await pool.add(client)
        client.hold = True
        first = asyncio.ensure_future(pool.poll_once())
        pool.poll_now("w0")  # a second poll while the first is open: both peaks start all zero
        while len(client.gates) < 2:
            await asyncio.sleep(0.001)
        entry = pool.workers["w0"]
        assert len(entry.traffic.poll_peaks) == 2
        client.gates[1].set()  # the later poll finishes first
        while len(entry.traffic.poll_peaks) != 1:
            await asyncio.sleep(0.001)
        # The earlier poll is still open: its peak sees this request come and go.
        entry.traffic.dispatch("r1", uncached=7, context=7)
        entry.traffic.finish("r1")
        client.gates[0].set()
        await first
        for _ in range(5000):
            if not entry.traffic.poll_peaks:
                break
            await asyncio.sleep(0.001)
        return entry.traffic.poll_peaks, entry.traffic.at_report

    try:
        open_polls, at_report = asyncio.run(scenario())
        assert open_polls == []  # each poll removed its own peak, none leaked
        assert at_report["waiting"] == 1 and at_report["queued_prefill_tokens"] == 7
    finally:
        host.shutdown()


def test_a_report_carries_its_host_tier_room_to_the_router():
    pool, _ = pool_with({"host_total_pages": 100, "host_free_pages": 7, "kv_bytes_per_token": 8})
    (s,) = pool.states()
    assert (s.host_free_pages, s.host_total_pages) == (7, 100)
    pool, _ = pool_with({})
    (s,) = pool.states()
    assert (s.host_free_pages, s.host_total_pages) == (0, 0)


def test_a_request_mid_prefill_is_one_waiting_request_not_two():
    """The worker reports a request still in its prefill chunks as waiting, as the router tallies
    its own until the first token: the pool sees one request. Counted running by the worker and
    waiting by the router, it read as two (ours waiting, and a running one taken for another
    router's) until the next report."""
    host = WorkerHost({"model": "tiny", "page_size": 4, "max_batch_tokens": 8}, "w0")
    gate = StepGate(host)  # the first 8-token chunk runs, then the engine waits

    async def scenario():
        pool = WorkerPool(ApproxIndex(4), poll_timeout_s=HELD_POLL_TIMEOUT_S)
        await pool.add(WorkerClient(LocalTransport(host), host.worker_id))
        pool.workers["w0"].traffic.dispatch("r1", uncached=40, context=40)
        stream = host.generate(GenerateRequest("r1", list(range(40)), SamplingParams(max_tokens=2)))
        first = asyncio.ensure_future(anext(stream))
        for _ in range(6000):  # until a report shows the first chunk computed (the gate holds)
            await pool.poll_once()
            r = pool.workers["w0"].report
            if 0 < r.queued_prefill_tokens < 40 - 1:
                break
            await asyncio.sleep(0.01)
        report = pool.workers["w0"].report
        assert (report.running, report.waiting) == (0, 1)
        assert report.queued_prefill_tokens == 40 - 8 - 1  # the first chunk computed
        assert report.active_decode_tokens == 0  # its context counts once it decodes
        (s,) = pool.states()
        gate.release()
        await first
        async for _ in stream:
            pass
        return s.running, s.waiting, s.active_decode_tokens

    try:
        assert asyncio.run(scenario()) == (0, 1, 0)
    finally:
        gate.release()
        host.shutdown()


def test_a_worker_without_prefix_reuse_gets_no_index_entries():
    """A worker whose cache is the reuse-off "chunk" (a hybrid model with state layers) shows as
    ``reuses=False``, and dispatching to it indexes nothing there: no policy then predicts a hit
    it cannot deliver. A reusing worker gets its request's blocks at once, as before."""
    from radixray.router.dispatch import Dispatcher
    from radixray.router.policies import RoutingRequest, make_policy

    pool = WorkerPool(ApproxIndex(4))
    chunk = WorkerInfo("c", "epoch", "tiny", 4, 4096, 320, "chunk", 64, "cpu", "")
    pool.workers["c"] = WorkerEntry(None, "c", chunk, LoadReport())
    pool.workers["r"] = entry("r")
    for wid in ("c", "r"):
        pool.index.add_worker(wid)
    reuses = {s.worker_id: s.reuses for s in pool.states()}
    assert reuses == {"c": False, "r": True}
    dispatch = Dispatcher(make_policy("round_robin"), pool.index, herd_window=0)
    blocks = [11, 12, 13]
    for k in range(2):  # round robin visits both workers
        request = RoutingRequest(k, 12, blocks, None, float(k))
        dispatch.decide(request, pool.states())
    assert pool.index.match(blocks) == {"r": 3}
