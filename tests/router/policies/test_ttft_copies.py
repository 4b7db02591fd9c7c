"""ttft's two rules about copies of a prefix (docs/ttft_policy.md, "Copies of a prefix"): moving
a request off the only worker that holds its prefix leaves that copy stale, which costs cache
room once the fleet's caches are full; a header that most workers hold counts as held by an
idle worker that lacks it, so the workers still without it are not kept out of new
conversations; and a request waits behind the queued work the scheduler admits before it."""

from __future__ import annotations

from radixray.router.policies import Decision, RoutingRequest, WorkerState, make_policy
from radixray.router.policies.waiting import Waiting

from .test_policies import P, index_with


def req(k: int = 0) -> RoutingRequest:
    return RoutingRequest(k, 8 * P, list(range(1000, 1008)), None)


def worker(wid, queued=0, running=0, free=0):
    return WorkerState(
        wid,
        running=running,
        queued_prefill_tokens=queued,
        free_pages=free,
        total_pages=100,
        prefill_tokens_per_s=100.0,
        decode_step_s=0.0,
    )


def test_ttft_prices_the_stale_copy_a_move_leaves_when_caches_are_full():
    """Worker 1 alone holds 6 of the 8 pages, behind 200 queued tokens; every cache is full.
    With the reuse share h at 0.75 (96 of 128 tokens found cached, arrival after arrival) and
    L = 0: staying costs 200 + 32 + 0.75 * 32 = 256 tokens; moving to an empty queue 128 + 0.75
    * 128 = 224, plus 0.75 * 96 = 72 for worker 1's copy left stale (296): it stays. Without the
    stale charge it moves; with free pages (caches not full) the stale copy costs nothing."""
    idx = index_with(w1=6)
    full = [worker(0), worker(1, queued=200, running=1), worker(2), worker(3)]
    new = make_policy("ttft", reuse_weight=0.0)
    old = make_policy("ttft", reuse_weight=0.0, stale=False)
    for k in range(1000):
        d_new, d_old = new.choose(req(k), full, idx), old.choose(req(k), full, idx)
    h = new.reuse
    assert abs(h - 0.75) < 1e-6 and old.reuse == h
    assert d_new.worker_id == 1 and d_new.reason == "ttft: best match"
    assert abs(d_new.scores[1] - (232 + 32 * h) / 100) < 1e-9  # 2.56 s
    assert abs(d_new.scores[0] - (128 + 128 * h + 96 * h) / 100) < 1e-9  # 2.96 s
    assert d_old.worker_id in (0, 2, 3)
    assert abs(d_old.scores[d_old.worker_id] - (128 + 128 * h) / 100) < 1e-9  # 2.24 s
    # Caches with room: nothing is evicted, nothing goes stale that costs room; it moves.
    roomy = [worker(0, free=100), worker(1, 200, 1, free=100), worker(2, free=100)]
    assert new.choose(req(), roomy, idx).worker_id in (0, 2)


def test_ttft_an_idle_worker_counts_a_header_most_workers_hold_as_held():
    """Workers 0, 1 and 2 hold a 4-page header of the 8-page prompt, each behind 30 queued
    tokens; worker 3 is idle and has never seen it. Counted as held there, it costs 64 tokens
    (0.64 s) against 30 + 64 (0.94 s): new conversations go to it. Held by two workers of four
    (more than a quarter) the same; by one, it is that worker's own (a conversation's history);
    and ``shared=false`` restores the rule that kept the idle worker out (1.28 s there)."""
    fleet = [worker(w, 30, 1, 100) for w in range(3)] + [worker(3, 0, 0, 100)]
    idx = index_with(w0=4, w1=4, w2=4)
    d = make_policy("ttft").choose(req(), fleet, idx)
    assert d.worker_id == 3 and abs(d.scores[3] - 0.64) < 1e-9
    assert abs(d.scores[0] - 0.94) < 1e-9
    assert d.predicted_cached_tokens == 0  # what the chosen worker holds, reported as it is
    former = {
        make_policy("ttft:shared=false", seed=s).choose(req(), fleet, idx).worker_id
        for s in range(20)
    }
    assert former == {0, 1, 2}
    one = index_with(w0=4)  # one holder: a conversation's own history, not a shared header
    assert make_policy("ttft").choose(req(), fleet, one).worker_id == 0
    two = index_with(w0=4, w1=4)  # two of four: more than a quarter, shared
    assert make_policy("ttft").choose(req(), fleet, two).worker_id == 3
    # the majority rule before (shared_share=0.5): two of four are theirs
    majority = make_policy("ttft", shared_share=0.5)
    assert majority.choose(req(), fleet, two).worker_id in (0, 1)
    assert majority.choose(req(), fleet, idx).worker_id == 3
    # the header on a busy worker that lacks it is still its own to compute
    busy = [*fleet[:3], worker(3, 0, 1, 100)]
    assert make_policy("ttft").choose(req(), busy, idx).worker_id in (0, 1, 2)


def test_waiting_counts_only_the_queued_work_a_request_waits_behind():
    """Three requests placed on worker 0: the first running (50 tokens of its prefill left), two
    waiting, 120 tokens with nothing cached and 100 with 64 cached; the queue reads 50 + 120 + 36
    (a worker counts what its waiting requests will compute, net of its cache). The
    scheduler admits by longest cached prefix: a request with 64 cached waits behind 50 + 36,
    one with none behind 50 + 120 + 36."""
    q = Waiting()
    for rid, tokens, cached in ((1, 100, 0), (2, 120, 0), (3, 100, 64)):
        q.placed(0, rid, tokens, cached)
    w = WorkerState(0, running=1, waiting=2, queued_prefill_tokens=206)
    assert q.ahead(w, 64) == 86 and q.ahead(w, 96) == 50 and q.ahead(w, 0) == 206
    # more waiting than this router placed (another router's requests): the whole queue
    assert q.ahead(WorkerState(0, running=1, waiting=4, queued_prefill_tokens=400), 64) == 400
    q.finished(0, 2)
    assert q.in_flight(0) == 2
    assert q.ahead(WorkerState(0, waiting=2, queued_prefill_tokens=136), 64) == 36
    small = Waiting(cap=2)
    for rid in range(5):
        small.placed(0, rid, 10, 0)
    assert small.in_flight(0) == 2


def test_ttft_keeps_a_prefix_whose_holder_queues_only_shorter_matches():
    """Worker 1 holds 6 of 8 pages; its 300 queued tokens are two requests this router placed
    there with nothing cached. Admitted by longest prefix, the new request goes ahead of both:
    staying costs its own 32 tokens, not 332, and it stays; charged the whole queue (lpm=false)
    it moves to an idle worker (128 tokens)."""
    idx = index_with(w1=6)
    room = {"free_pages": 100, "total_pages": 100, "prefill_tokens_per_s": 100.0}
    workers = [WorkerState(w, **room) for w in (0, 2, 3)]
    workers.insert(1, WorkerState(1, running=2, waiting=2, queued_prefill_tokens=300, **room))
    picks = {}
    for lpm in (True, False):
        pol = make_policy("ttft", lpm=lpm, reuse_weight=0.0)
        for rid in (101, 102):  # earlier placements, 150 tokens each, nothing cached
            pol.on_dispatch(Decision(1, "earlier", 0), RoutingRequest(rid, 150, [7, rid], None))
        picks[lpm] = pol.choose(req(), workers, idx)
    assert picks[True].worker_id == 1 and abs(picks[True].scores[1] - 0.32) < 1e-9
    assert picks[False].worker_id in (0, 2, 3) and abs(picks[False].scores[1] - 3.32) < 1e-9
    pol.on_complete(101, 1, 0)
