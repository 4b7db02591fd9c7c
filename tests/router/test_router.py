"""Router.open's retry rules, with fake worker clients (the real ones are tested elsewhere):
a failure before the first token is retried on another worker, one after it is not, an engine
failure is retried once and then is a 500, a client error is never retried."""

from __future__ import annotations

import asyncio

import pytest

from radixray.cache_index import ApproxIndex
from radixray.cache_index.events import EventBatch, encode_events
from radixray.protocol import (
    EngineFailure,
    GenerateRequest,
    InvalidRequest,
    LoadReport,
    Overloaded,
    PollResult,
    SamplingParams,
    StreamChunk,
    WorkerCounters,
    WorkerInfo,
    WorkerUnavailable,
)
from radixray.router.policies import make_policy
from radixray.router.request_path import NoWorkerAvailable, RequestFailed, Router
from radixray.router.worker_pool import WorkerPool

PARAMS = SamplingParams(max_tokens=2)
FINAL = StreamChunk([5], "x", 0, "length", 3, 2, {"cold": 3})


class FakeClient:
    """A worker client that answers with real protocol messages; ``fail`` says how its next
    generate goes: None (fine), an exception before the first chunk, or ("after", exc)."""

    def __init__(self, worker_id: str):
        self.worker_id = worker_id
        self.address = f"fake:{worker_id}"
        self.fail: list = []
        self.generated: list[str] = []
        self.aborted: list[str] = []

    async def info(self) -> WorkerInfo:
        return WorkerInfo(self.worker_id, "e", "tiny", 4, 4096, 320, "radix", 64, "cpu", "p")

    async def poll(self, since_seq=-1, epoch=None, router_id=None) -> PollResult:
        batch = encode_events(EventBatch(self.worker_id, 0, 0.0, []))
        load = LoadReport(total_pages=64, free_pages=64)
        return PollResult(self.worker_id, "e", 0, True, batch, True, load, WorkerCounters())

    async def generate(self, req: GenerateRequest):
        self.generated.append(req.request_id)
        how = self.fail.pop(0) if self.fail else None
        if isinstance(how, Exception):
            raise how
        yield StreamChunk([4], "a", 0)
        if isinstance(how, tuple):
            raise how[1]
        yield FINAL

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def close(self) -> None:
        pass


def setup(n: int = 2) -> tuple[Router, list[FakeClient]]:
    clients = [FakeClient(f"w{i}") for i in range(n)]
    pool = WorkerPool(ApproxIndex(4))
    router = Router(pool, make_policy("round_robin"), retry_backoff_s=0.0)

    async def add():
        for c in clients:
            await pool.add(c)

    asyncio.run(add())
    return router, clients


def open_and_read(router: Router, rid: str) -> tuple[str, list[StreamChunk]]:
    async def go():
        stream = await router.open(GenerateRequest(rid, [1, 2, 3], PARAMS))
        chunks = [c async for c in stream]
        return stream.worker_id, chunks

    return asyncio.run(go())


def attempts(router: Router, rid: str) -> list[tuple[int, str, str | None]]:
    return [
        (r.attempts, r.worker_id, r.error) for r in router.dispatch.decisions if r.request_id == rid
    ]


def test_unavailable_before_the_first_token_is_retried_elsewhere_and_marked_down():
    router, (a, b) = setup()
    a.fail = [WorkerUnavailable("connection refused")]
    worker, chunks = open_and_read(router, "r1")
    assert worker == "w1" and chunks[-1] == FINAL
    assert a.generated == ["r1"] and b.generated == ["r1"]
    assert attempts(router, "r1") == [(1, "w0", "worker w0: connection refused"), (2, "w1", None)]
    assert not router.pool.workers["w0"].healthy  # marked down: the next goes to w1 only
    assert router.pool.routable() == ["w1"]
    assert all(not e.inflight for e in router.pool.workers.values())  # tallies released


def test_a_failure_after_the_first_token_is_not_retried():
    router, (a, b) = setup()
    a.fail = [("after", WorkerUnavailable("reset by peer"))]

    async def go():
        stream = await router.open(GenerateRequest("r2", [1, 2, 3], PARAMS))
        got = []
        with pytest.raises(WorkerUnavailable, match="reset by peer"):
            async for c in stream:
                got.append(c)
        return got

    got = asyncio.run(go())
    assert [c.text for c in got] == ["a"]  # the first chunk reached the caller
    assert b.generated == []  # never retried once streaming
    (rec,) = [r for r in router.dispatch.decisions if r.request_id == "r2"]
    assert rec.finish_reason == "error" and "failed mid-stream" in rec.error
    assert not router.pool.workers["w0"].inflight


def test_an_engine_failure_is_retried_once_then_is_a_500():
    router, (a, b) = setup()
    a.fail = [EngineFailure("CUDA error")]
    worker, _ = open_and_read(router, "r3")
    assert worker == "w1"
    assert router.pool.workers["w0"].healthy  # an engine failure does not mark it down
    a.fail = [EngineFailure("CUDA error")]
    b.fail = [EngineFailure("CUDA error")]
    with pytest.raises(RequestFailed, match="the engine failed on 2 workers"):
        open_and_read(router, "r4")
    # With no other worker left after the first failure: still the engine's failure (500).
    router1, (only,) = setup(1)
    only.fail = [EngineFailure("CUDA error")]
    with pytest.raises(RequestFailed, match="no other worker is left"):
        open_and_read(router1, "r5")


def test_a_client_error_is_never_retried_and_releases_its_tally():
    router, (a, b) = setup()
    a.fail = [InvalidRequest("max_tokens is too large", "max_tokens")]
    with pytest.raises(InvalidRequest) as err:
        open_and_read(router, "r6")
    assert err.value.param == "max_tokens" and b.generated == []
    pool = router.pool.workers.values()
    assert all(not e.inflight and not e.traffic.now["waiting"] for e in pool)


def test_no_worker_left_is_503():
    router, (a, b) = setup()
    a.fail = [WorkerUnavailable("down")]
    b.fail = [WorkerUnavailable("down too")]
    with pytest.raises(NoWorkerAvailable, match="No worker is available"):
        open_and_read(router, "r7")
    assert router.pool.routable() == []


class FleetRecorder:
    """A policy that routes round-robin and keeps the fleet each request came with."""

    def __init__(self):
        self.inner = make_policy("round_robin")
        self.fleets: list[tuple[int, int]] = []

    def choose(self, request, workers, index):
        self.fleets.append(request.fleet)
        return self.inner.choose(request, workers, index)

    def on_dispatch(self, decision, request):
        pass

    def on_complete(self, request_id, worker_id, cached_tokens):
        pass


def test_the_fleet_view_comes_with_each_request_and_the_policy_is_not_touched():
    router, (a, b) = setup()
    policy = router.policy = FleetRecorder()
    before = dict(vars(policy))
    positions = iter([(1, 3), (2, 3), (0, 2)])
    router.pool.fleet_position = lambda: next(positions)
    open_and_read(router, "r8")
    b.fail = [WorkerUnavailable("down")]  # r9 goes to w1 first; its retry reads the fleet again
    open_and_read(router, "r9")
    assert policy.fleets == [(1, 3), (2, 3), (0, 2)]
    assert vars(policy).keys() == before.keys()


def admitted(router: Router) -> int:
    return router.admission.inflight


def test_every_ending_releases_the_admission_slot_and_the_tally_exactly_once():
    router, (a, b) = setup()
    router.admission.limit = 1

    async def go():
        s = await router.open(GenerateRequest("ok", [1, 2, 3], PARAMS))
        assert admitted(router) == 1 and router.pool.workers[s.worker_id].inflight
        with pytest.raises(Overloaded, match=r"1 requests in flight \(limit 1\)"):
            await router.open(GenerateRequest("refused", [1, 2, 3], PARAMS))
        assert admitted(router) == 1  # a refused request holds nothing
        assert [c async for c in s][-1] == FINAL
        await s.aclose()  # closing after the end releases nothing twice
        assert admitted(router) == 0
        s = await router.open(GenerateRequest("early", [1, 2, 3], PARAMS))
        await s.aclose()  # the client went away before reading
        await s.aclose()
        assert admitted(router) == 0 and s.record.finish_reason == "abort"
        assert [c async for c in s] == []  # nothing more once ended
        a.fail = b.fail = [("after", WorkerUnavailable("reset"))]
        s = await router.open(GenerateRequest("mid", [1, 2, 3], PARAMS))
        with pytest.raises(WorkerUnavailable):
            async for _ in s:
                pass
        await s.aclose()
        assert admitted(router) == 0
        a.fail, b.fail = [InvalidRequest("bad", "max_tokens")], [InvalidRequest("bad", "n")]
        with pytest.raises(InvalidRequest):
            await router.open(GenerateRequest("bad", [1, 2, 3], PARAMS))
        assert admitted(router) == 0

    asyncio.run(go())
    for e in router.pool.workers.values():
        assert not e.inflight and set(e.traffic.now.values()) == {0}
