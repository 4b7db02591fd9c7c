"""WorkerPool load accounting: own traffic now + other routers' traffic from the last report."""

from radixray.cache_index import ApproxIndex
from radixray.router.worker_pool import WorkerEntry, WorkerPool


def pool_with(report: dict, own_at_report: dict | None = None) -> tuple[WorkerPool, WorkerEntry]:
    pool = WorkerPool(ApproxIndex(4))
    e = WorkerEntry(client=None, worker_id="w", report=report)
    e.own_at_report = own_at_report or {}
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
    pool.track_dispatch("w", "r1", uncached=40, context=60)
    pool.track_dispatch("w", "r2", uncached=10, context=20)
    pool.track_first_token("w", "r2")
    (s,) = pool.states()
    # ours now: 1 waiting (40 uncached), 1 running (20 context); others: 2 running, 2 waiting.
    assert (s.running, s.waiting) == (1 + 2, 1 + 2)
    assert s.queued_prefill_tokens == 40 + 700
    assert s.active_decode_tokens == 20 + 90
    pool.track_finish("w", "r1")
    pool.track_finish("w", "r2")
    (s,) = pool.states()
    assert (s.running, s.waiting, s.queued_prefill_tokens) == (2, 2, 700)


def test_unmeasured_rate_borrows_the_mean_of_measured_workers():
    pool = WorkerPool(ApproxIndex(4))
    for wid, rate in (("a", 100.0), ("b", 300.0), ("c", None)):
        pool.workers[wid] = WorkerEntry(
            client=None, worker_id=wid, report={"prefill_tokens_per_s": rate}
        )
    rates = {s.worker_id: s.prefill_tokens_per_s for s in pool.states()}
    assert rates == {"a": 100.0, "b": 300.0, "c": 200.0}


def test_down_and_draining_workers_are_not_routable():
    pool = WorkerPool(ApproxIndex(4))
    for wid in ("a", "b", "c"):
        pool.workers[wid] = WorkerEntry(client=None, worker_id=wid)
        pool.index.add_worker(wid)
    pool.index.insert("b", [1, 2, 3])
    pool.mark_down("b", "test")
    pool.workers["c"].draining = True
    assert pool.routable() == ["a"]
    assert pool.index.num_blocks("b") == 0
