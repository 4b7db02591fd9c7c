"""Policies over a fleet with host tiers: the fixed-discount baselines (kv_cost's host-block
weight, Dynamo's 0.75 and llm-d's 0.8) and tier-blind routing (weight 0)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from radixray.cache_index import BlockRemoved, BlockStored
from radixray.router.policies import make_policy
from radixray.router.policies.ttft import TERMS

from .test_policies import P, index_with, req, ws

EVICT = TERMS.index("evict")


def _tiered_index():
    """Worker 0: the request's first 2 blocks on its device, the next 4 on its host tier;
    worker 1: the first 4 on its device."""
    idx = index_with(w0=2, w1=4)
    idx.insert(0, list(range(1002, 1006)), tier="host")
    return idx


def test_kv_cost_weighs_host_blocks_at_its_discount():
    idx = _tiered_index()
    workers = [ws(0), ws(1)]
    # overlap: w0 = 2 + 0.75 * 4 = 5 blocks, w1 = 4 -> prefill 3 vs 4 blocks
    d = make_policy("kv_cost").choose(req(8), workers, idx)
    assert d.scores == {0: 3 + 8.0, 1: 4 + 8.0} and d.worker_id == 0
    assert d.predicted_cached_tokens == 2 * P  # the device hit; the rest is loaded
    d = make_policy("kv_cost", host_block_weight=0.8).choose(req(8), workers, idx)
    assert d.scores[0] == pytest.approx(8 - 2 - 3.2 + 8)
    blind = make_policy("kv_cost", host_block_weight=0.0).choose(req(8), workers, idx)
    assert blind.worker_id == 1 and blind.scores == {0: 6 + 8.0, 1: 4 + 8.0}


def test_host_weight_is_checked():
    with pytest.raises(ValueError, match="host_block_weight must be in"):
        make_policy("kv_cost", host_block_weight=1.5)


def _ttft(**kw):
    return make_policy("ttft", reuse_weight=0.0, **kw)


def test_ttft_loads_from_a_host_tier_when_its_measured_load_time_says_so():
    """A 128-token prompt: worker 0 holds 32 tokens on its device and 64 more on its host tier,
    worker 1 holds 64 on its device. At 500 prefill tokens/s, worker 1 costs 64 / 500 = 0.128 s;
    worker 0 computes 32 (0.064 s) and loads 64: fast enough at 10,000 tokens/s (6.4 ms), not at
    100 tokens/s (0.64 s). A busy holder, or one whose host tier is unmeasured, loses too."""
    idx = _tiered_index()
    fast = replace(ws(0), load_tokens_per_s=10_000.0, load_overhead_s=0.001)
    d = _ttft().choose(req(8), [fast, ws(1)], idx)
    assert d.worker_id == 0 and d.predicted_cached_tokens == 6 * P
    assert d.scores[0] == pytest.approx(32 / 500 + 0.001 + 64 / 10_000)
    assert d.scores[1] == pytest.approx(64 / 500)
    slow = replace(fast, load_tokens_per_s=100.0)
    assert _ttft().choose(req(8), [slow, ws(1)], idx).worker_id == 1
    busy = replace(fast, queued_prefill_tokens=500)
    assert _ttft().choose(req(8), [busy, ws(1)], idx).worker_id == 1
    blind = _ttft().choose(req(8), [ws(0), ws(1)], idx)  # no host tier reported: recompute
    assert blind.worker_id == 1 and blind.scores[0] == pytest.approx(96 / 500)


def test_a_report_becomes_a_load_cost():
    from radixray.protocol import LoadReport
    from radixray.router.worker_pool import PRIOR_LOAD_BYTES_PER_S, _load_cost

    assert _load_cost(LoadReport()) == (0.0, 0.0)  # no host tier
    tiered = LoadReport(host_total_pages=100, kv_bytes_per_token=1000)
    assert _load_cost(tiered) == (PRIOR_LOAD_BYTES_PER_S / 1000, 0.0)  # nothing loaded yet
    fitted = LoadReport(
        host_total_pages=100, kv_bytes_per_token=1000, load_bytes_per_s=2e9, load_overhead_s=0.002
    )
    assert _load_cost(fitted) == (2e6, 0.002)


def test_the_decision_record_splits_reuse_by_tier():
    from radixray.router.dispatch import Dispatcher

    idx = _tiered_index()
    fast = replace(ws(0), load_tokens_per_s=10_000.0, prefill_overhead_s=0.004)
    dispatch = Dispatcher(_ttft(), idx, optimistic=False, herd_window=0)
    decision, rec = dispatch.decide(req(8), [fast, ws(1)])
    # the fit the chosen worker was priced with, beside the placement
    assert (rec.prefill_tokens_per_s, rec.prefill_overhead_s) == (500.0, 0.004)
    assert rec.as_dict()["prefill_tokens_per_s"] == 500.0
    assert decision.worker_id == 0
    # the longest reusable prefix: 6 blocks on worker 0, 4 of them only on its host tier; the
    # longest device-only prefix anywhere is worker 1's 4 blocks
    assert (rec.available_tokens, rec.available_host_tokens) == (6 * P, 2 * P)
    assert (rec.captured_tokens, rec.captured_host_tokens) == (6 * P, 4 * P)
    assert rec.predicted_cached_tokens == 6 * P


def test_ttft_prices_what_a_placement_evicts_into_a_host_tier_at_its_load_time():
    """Both workers hold the first 2 blocks and have no free page: the 128-token prompt pushes
    96 cached tokens out of either. On worker 0 they are demoted to its host tier (a later
    request loads them back at 10,000 tokens/s), on worker 1 they are lost (recomputed at 500
    tokens/s): each weighted by the measured reuse share h, 0.125 after this request."""
    idx = index_with(w0=2, w1=2)
    full = {"free_pages": 0, "total_pages": 100}
    tiered = replace(ws(0), load_tokens_per_s=10_000.0, **full)
    plain = replace(ws(1), **full)
    d = _ttft(memory=2).choose(req(8), [tiered, plain], idx)
    h = 0.5 * (32 / 128)
    assert d.worker_id == 0
    assert d.scores[0] == pytest.approx((128 - 32) / 500 + h * 96 / 10_000)
    assert d.scores[1] == pytest.approx((128 - 32 + h * 96) / 500)
    # tier-blind: the host copies are invisible, so a demotion is priced as a loss too
    blind = _ttft(memory=2, tiers=False).choose(req(8), [tiered, plain], idx)
    assert blind.scores[0] == pytest.approx(blind.scores[1])


def test_ttft_prices_what_a_full_host_tier_must_drop_as_lost():
    """As above, but worker 1 has 2 free pages (it pushes out 64 cached tokens, not 96). Worker
    0's 96 are demoted as far as its host tier has room (free pages, or host copies it drops
    losing nothing: what it reports as free); what does not fit pushes as many tokens out of
    the host tier, lost (a recompute, at the lost-block rate: h before any loss): the evict
    term, h * lost / 500 + h * (96 - lost) / 10,000. With room it wins; full, it loses, by the
    evict term (h * 96 / 500 where a fitting demotion would cost h * 96 / 10,000)."""
    idx = index_with(w0=2, w1=2)
    host = {"load_tokens_per_s": 10_000.0, "free_pages": 0, "total_pages": 100}
    plain = replace(ws(1), free_pages=2, total_pages=100)
    h = 0.5 * (32 / 128)
    w1 = (96 + h * 64) / 500
    for host_free, lost in ((100, 0), (3, 48), (0, 96)):
        tiered = replace(ws(0), host_free_pages=host_free, host_total_pages=100, **host)
        d = _ttft(memory=2).choose(req(8), [tiered, plain], idx)
        assert d.scores[0] == pytest.approx((96 + h * lost) / 500 + h * (96 - lost) / 10_000)
        assert d.scores[1] == pytest.approx(w1)
        evict = h * lost / 500 + h * (96 - lost) / 10_000
        assert d.terms[0] == pytest.approx((0, 96 / 500, 0, 0, evict, 0), abs=1e-12)
        assert d.terms[1] == pytest.approx((0, 96 / 500, 0, 0, h * 64 / 500, 0), abs=1e-12)
        assert d.worker_id == (1 if lost == 96 else 0) and d.decided_by == "evict"
    # a worker that does not report its host tier's size: every demotion fits, as before
    unsized = replace(ws(0), **host)
    d = _ttft(memory=2).choose(req(8), [unsized, plain], idx)
    assert d.worker_id == 0 and d.scores[0] == pytest.approx(96 / 500 + h * 96 / 10_000)
    assert d.terms[0][EVICT] == pytest.approx(h * 96 / 10_000, abs=1e-12)


def test_ttft_prices_an_eviction_at_the_rate_lost_blocks_come_back():
    """Worker 0 is idle with a full cache: the 128-token prompt evicts 128 cached tokens there.
    Worker 1 has room and 40 tokens queued, and holds the first 2 blocks (h = 0.125 after this
    request). Priced at h, the eviction (16 tokens' recompute) outweighs the queue: worker 1.
    Once the index has seen 10,000 blocks evicted and none computed again, an evicted token is
    worth ~1% of a recompute and the idle worker wins; when lost blocks within the horizon (the
    fleet's 200 pages of losses) are computed again, the rate rises with them."""
    full = replace(ws(0), free_pages=0)
    queued = ws(1, queued=40)
    h, stale = 0.5 * (32 / 128), 0.5 * 32  # f = 0.5 of the fleet's pages in use

    def choose(idx, **kw):
        policy = _ttft(memory=2, **kw)
        return policy.choose(req(8), [full, queued], idx)

    idx = index_with(w1=2)
    d = choose(idx)  # nothing lost yet: the prior, h
    assert d.worker_id == 1 and d.scores[0] == pytest.approx((128 + h * stale + h * 128) / 500)
    terms = (0, 128 / 500, 0, h * stale / 500, h * 128 / 500, 0)
    assert d.terms[0] == pytest.approx(terms, abs=1e-12)
    assert d.terms[1] == pytest.approx((40 / 500, 96 / 500, 0, 0, 0, 0), abs=1e-12)
    assert d.scores[1] == pytest.approx((40 + 96) / 500)
    assert idx.lost.capacity == 200  # the horizon: the fleet's pages
    cold = list(range(5000, 15_000))
    idx.apply(2, [BlockStored(cold, None, [], P), BlockRemoved(cold)])
    assert idx.lost.total_losses == 10_000
    d = choose(idx)
    r = idx.lost.rate(h)
    assert r < 0.01 and d.worker_id == 0
    assert d.scores[0] == pytest.approx((128 + h * stale + r * 128) / 500)
    # the evict term at the lost-block rate; at h (0.032 s) it would keep the request off
    # worker 0, and the queue is now what separates them
    assert d.terms[0][EVICT] == pytest.approx(r * 128 / 500, abs=1e-12)
    assert d.scores[0] - d.terms[0][EVICT] + h * 128 / 500 > d.scores[1]
    assert d.decided_by == "wait"
    idx.apply(3, [BlockStored(cold[:9_800], None, [], P)])  # lost beyond the horizon
    assert idx.lost.total_returns == 0
    idx.apply(3, [BlockStored(cold[9_800:], None, [], P)])  # the last 200: computed again
    assert idx.lost.total_returns == 200 and idx.lost.rate(h) > 0.9
    assert choose(idx).worker_id == 1
