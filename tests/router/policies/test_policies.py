"""Policies on hand-built worker states and a real ApproxIndex: exact choices, tie-breaks and the
imbalance branches."""

from __future__ import annotations

import dataclasses

import pytest

from radixray.cache_index import ApproxIndex
from radixray.router.policies import (
    NoHealthyWorker,
    RoutingRequest,
    WorkerState,
    make_policy,
    policy_names,
)

P = 16
ALL = [
    "cache_aware",
    "cache_aware_events",
    "cache_aware_smallest_cache",
    "cache_aware_v03",
    "consistent_hash",
    "kv_cost",
    "kv_cost_summed",
    "least_load",
    "power_of_two",
    "random",
    "round_robin",
    "ttft",
]


def ws(wid, running=0, waiting=0, queued=0, decode=0, rate=500.0, step=0.05, healthy=True):
    return WorkerState(
        worker_id=wid,
        running=running,
        waiting=waiting,
        queued_prefill_tokens=queued,
        active_decode_tokens=decode,
        free_pages=100,
        total_pages=100,
        prefill_tokens_per_s=rate,
        decode_step_s=step,
        healthy=healthy,
    )


def req(n_blocks=8, tokens=None, session=None, base=1000, rid=0):
    hashes = list(range(base, base + n_blocks))
    return RoutingRequest(rid, tokens if tokens is not None else n_blocks * P, hashes, session)


def index_with(**held) -> ApproxIndex:
    """index_with(w1=5) -> worker 1 holds the first 5 blocks of req()."""
    idx = ApproxIndex(P, 1 << 16)
    for w in range(4):
        idx.add_worker(w)
    for name, n in held.items():
        idx.insert(int(name[1:]), list(range(1000, 1000 + n)))
    return idx


def test_registry_lists_names_on_a_miss():
    assert policy_names() == ALL
    with pytest.raises(
        ValueError, match="valid names: cache_aware, cache_aware_events, cache_aware_smallest_cache"
    ):
        make_policy("nope")


@pytest.mark.parametrize("name", ALL)
def test_never_picks_an_unhealthy_worker_and_raises_when_none(name):
    pol = make_policy(name, seed=1)
    idx = index_with(w0=8)
    workers = [ws(0, healthy=False), ws(1, running=3), ws(2, healthy=False), ws(3, running=1)]
    for i in range(20):
        d = pol.choose(req(rid=i, session=f"s{i}"), workers, idx)
        assert d.worker_id in (1, 3)
    with pytest.raises(NoHealthyWorker):
        pol.choose(req(), [ws(0, healthy=False)], idx)


def test_round_robin_cycles_in_order():
    pol = make_policy("round_robin")
    workers = [ws(i) for i in range(3)]
    assert [pol.choose(req(), workers, index_with()).worker_id for _ in range(7)] == [
        0, 1, 2, 0, 1, 2, 0,
    ]  # fmt: skip


def test_random_is_seeded():
    workers = [ws(i) for i in range(4)]
    a = [make_policy("random", seed=3).choose(req(), workers, index_with()).worker_id]
    b = [make_policy("random", seed=3).choose(req(), workers, index_with()).worker_id]
    assert a == b
    pol = make_policy("random", seed=3)
    assert {pol.choose(req(), workers, index_with()).worker_id for _ in range(200)} == {0, 1, 2, 3}


def test_least_load_ties_break_on_queued_prefill_then_order():
    pol = make_policy("least_load")
    idx = index_with()
    assert pol.choose(req(), [ws(0, 2), ws(1, 1), ws(2, 1)], idx).worker_id == 1
    assert pol.choose(req(), [ws(0, 1, queued=50), ws(1, 1, queued=10)], idx).worker_id == 1
    assert pol.choose(req(), [ws(0, 1), ws(1, 0, waiting=1)], idx).worker_id == 0


def test_power_of_two_takes_the_less_loaded_of_two():
    pol = make_policy("power_of_two", seed=0)
    idx = index_with()
    for _ in range(20):
        assert pol.choose(req(), [ws(0, running=5), ws(1, running=1)], idx).worker_id == 1
    # With three workers the busiest can only win if both samples are it: never.
    picks = {pol.choose(req(), [ws(0, 9), ws(1, 1), ws(2, 2)], idx).worker_id for _ in range(100)}
    assert 0 not in picks and picks <= {1, 2}
    assert pol.choose(req(), [ws(7)], idx).worker_id == 7


def test_consistent_hash_is_sticky_and_bounded():
    pol = make_policy("consistent_hash", epsilon=0.25)
    idx = index_with()
    workers = [ws(i) for i in range(4)]
    home = pol.choose(req(session="alice"), workers, idx).worker_id
    assert all(pol.choose(req(session="alice"), workers, idx).worker_id == home for _ in range(5))
    homes = {pol.choose(req(session=f"user{i}"), workers, idx).worker_id for i in range(64)}
    assert homes == {0, 1, 2, 3}  # sessions spread over the ring
    # Home at the bound: total load 8 -> capacity ceil(1.25 * 9 / 4) = 3.
    loaded = [ws(i, running=3 if i == home else 1) for i in range(4)]
    d = pol.choose(req(session="alice"), loaded, idx)
    assert d.worker_id != home and d.reason == "consistent_hash: home full"
    # Without a session the first block is the key: one system prompt sticks to one worker.
    a = pol.choose(req(base=5), workers, idx).worker_id
    assert pol.choose(req(base=5, n_blocks=3), workers, idx).worker_id == a


def test_cache_aware_balanced_longest_match():
    pol = make_policy("cache_aware_v03")
    idx = index_with(w1=4, w2=6)
    d = pol.choose(req(8), [ws(i, running=1) for i in range(4)], idx)
    assert d.worker_id == 2 and d.predicted_cached_tokens == 6 * P
    assert d.reason == "cache_aware_v03: longest match"


def test_cache_aware_match_tie_goes_to_less_loaded():
    pol = make_policy("cache_aware_v03")
    idx = index_with(w1=6, w2=6)
    d = pol.choose(req(8), [ws(0), ws(1, running=3), ws(2, running=2), ws(3)], idx)
    assert d.worker_id == 2


def test_cache_aware_low_match_goes_to_least_load_and_the_old_variant_to_smallest_cache():
    idx = index_with(w1=2)  # threshold 0.3: 2 of 8 blocks is 0.25
    idx.insert(0, [7, 8, 9])
    idx.insert(3, [11])
    idx.insert(2, [12, 13])
    states = [ws(0, 2), ws(1, 2), ws(2, 1), ws(3, 2)]
    d = make_policy("cache_aware_v03").choose(req(8), states, idx)  # SGLang since PR #14650
    assert d.worker_id == 2 and d.reason == "cache_aware_v03: low match -> least load"
    # before it: the smallest cache (worker 3 holds one block), whatever its load
    for old in (
        make_policy("cache_aware_smallest_cache"),
        make_policy("cache_aware_v03:fallback=smallest_cache"),
    ):
        d = old.choose(req(8), states, idx)
        assert d.worker_id == 3 and d.reason == "cache_aware_v03: low match -> smallest cache"


def test_policy_specs_pass_arguments_and_name_the_variant():
    pol = make_policy("cache_aware_v03:fallback=smallest_cache:cache_threshold=0.5", seed=3)
    assert (pol.fallback, pol.cache_threshold, pol.name) == (
        "smallest_cache",
        0.5,
        "cache_aware_v03:fallback=smallest_cache:cache_threshold=0.5",
    )
    assert make_policy("cache_aware").name == "cache_aware"
    old = make_policy("cache_aware_smallest_cache:cache_threshold=0.9")
    assert (old.fallback, old.cache_threshold) == ("smallest_cache", 0.9)
    assert make_policy("ttft:seed=none").name == "ttft:seed=none"
    with pytest.raises(ValueError, match="policy 'cache_aware_v03' has no parameter 'fallbak'; its "
                       "parameters: seed, cache_threshold"):  # fmt: skip
        make_policy("cache_aware_v03:fallbak=least_load")
    with pytest.raises(ValueError, match="expected key=value after ':', got 'oops'"):
        make_policy("cache_aware_v03:oops")
    with pytest.raises(ValueError, match="fallback must be 'smallest_cache' or 'least_load'"):
        make_policy("cache_aware_v03:fallback=biggest")
    with pytest.raises(ValueError, match="unknown routing policy 'nope'"):
        make_policy("nope:x=1")


def test_cache_aware_imbalance_needs_both_thresholds():
    idx = index_with(w1=8)
    pol = make_policy("cache_aware_v03", balance_abs_threshold=4, balance_rel_threshold=1.5)
    # max - min = 9 > 4 and 10 > 1.5 * 1: imbalanced -> shortest queue despite the match.
    d = pol.choose(req(8), [ws(0, 1), ws(1, 10), ws(2, 3), ws(3, 2)], idx)
    assert d.worker_id == 0 and "imbalanced" in d.reason
    # max - min = 5 > 4 but 25 < 1.5 * 20: balanced -> the match wins.
    d = pol.choose(req(8), [ws(0, 20), ws(1, 25), ws(2, 21), ws(3, 22)], idx)
    assert d.worker_id == 1
    # 10 > 1.5 * 1 but max - min = 3 (abs 4 not exceeded): balanced.
    d = pol.choose(req(8), [ws(0, 1), ws(1, 4), ws(2, 3), ws(3, 2)], idx)
    assert d.worker_id == 1


def test_kv_cost_summed_exact_costs():
    pol = make_policy("kv_cost_summed")
    idx = index_with(w1=6)
    workers = [ws(0, queued=0, decode=0), ws(1, queued=32, decode=32), ws(2, queued=160)]
    d = pol.choose(req(8), workers, idx)
    # Active blocks are every request's on the worker, queued ones too (as Dynamo adds a request's
    # blocks when it routes it): w0: prefill 8, active 0 + 8 -> 16; w1: 2 + (8 - 6) = 4,
    # active (32 + 32) / 16 + 8 = 12 -> 16; w2: 10 + 8 = 18, active 10 + 8 = 18 -> 36. w0 and w1
    # tie at 16.
    assert d.scores == {0: 16.0, 1: 16.0, 2: 36.0}
    picks = {
        make_policy("kv_cost_summed", seed=s).choose(req(8), workers, idx).worker_id
        for s in range(30)
    }
    assert picks == {0, 1}
    heavy = make_policy("kv_cost_summed", overlap_score_weight=2.0)
    assert heavy.choose(req(8), workers, idx).worker_id == 1  # 2 * 4 + 12 = 20 < 2 * 8 + 8


def test_ttft_predicts_queue_plus_uncached_over_measured_rate():
    pol = make_policy("ttft", reuse_weight=0.0)
    idx = index_with(w1=6)
    workers = [ws(0, queued=0, rate=100.0), ws(1, queued=100, rate=100.0, running=1, step=0.1)]
    d = pol.choose(req(8), workers, idx)
    # w0: 128 / 100 = 1.28 s; w1: (100 + 128 - 96) / 100 + 0.1 = 1.42 s -> w0.
    assert d.worker_id == 0
    assert d.scores[0] == pytest.approx(1.28) and d.scores[1] == pytest.approx(1.42)
    # A faster worker (measured rate) changes the answer: rates come from WorkerState.
    workers[1] = ws(1, queued=100, rate=200.0, running=1, step=0.1)
    assert pol.choose(req(8), workers, idx).worker_id == 1


def test_ttft_reuse_term_keeps_the_prefix_when_the_cluster_is_busy():
    idx = index_with(w1=6)
    workers = [ws(0, queued=0, rate=100.0), ws(1, queued=100, rate=100.0, running=1, step=0.1)]
    # Weight 1: w0 pays (128 + 96) / 100 = 2.24 > 1.42 -> stays with the prefix.
    assert make_policy("ttft", reuse_weight=1.0).choose(req(8), workers, idx).worker_id == 1
    # Measured weight: busy workers raise rho, and with it the reuse charge.
    pol = make_policy("ttft")
    busy = [ws(i, running=1, queued=100, rate=100.0, step=0.0) for i in range(4)]
    for _ in range(200):
        pol.choose(req(8), busy, idx)
    assert pol.rho > 0.9
    assert pol.choose(req(8), busy, idx).worker_id == 1
    idle = make_policy("ttft")
    assert idle.choose(req(8), [ws(i) for i in range(4)], idx).worker_id == 1  # match, no queue


def test_ttft_never_counts_the_last_token_as_cached_and_breaks_ties_at_random():
    idx = index_with(w0=8, w1=8)
    d = make_policy("ttft").choose(req(8), [ws(0), ws(1), ws(2), ws(3)], idx)
    assert d.predicted_cached_tokens == 8 * P - 1
    picks = {
        make_policy("ttft", seed=s).choose(req(8), [ws(0), ws(1), ws(2), ws(3)], idx).worker_id
        for s in range(30)
    }
    assert picks == {0, 1}


@pytest.mark.parametrize("name", ["ttft", "kv_cost"])
def test_in_a_fleet_ties_go_by_the_rank_the_request_carries(name):
    # Four idle workers tie. A router of rank r among 3 starts at the r-th worker by id, then
    # takes the next on each later tie; alone (fleet (0, 1)) it picks at random. The fleet comes
    # with each request: nothing is set on the policy, so one policy serves any router position.
    idle = [ws(3), ws(1), ws(0), ws(2)]
    idx = index_with()
    for rank in range(3):
        pol = make_policy(name, seed=0)
        in_fleet = dataclasses.replace(req(8), fleet=(rank, 3))
        picks = [pol.choose(in_fleet, idle, idx).worker_id for _ in range(5)]
        assert picks == [(rank + i) % 4 for i in range(5)]
        assert "fleet" not in vars(pol)
    alone = {make_policy(name, seed=s).choose(req(8), idle, idx).worker_id for s in range(40)}
    assert alone == {0, 1, 2, 3}


def test_ttft_breaks_a_tie_by_the_cache_key_the_same_on_every_router():
    # A prompt_cache_key decides exact ties by a hash of key and worker id: every router (any
    # rank, any seed, any earlier ties) sends a key's ties to the same worker; keys spread over
    # the workers; a worker leaving moves only the keys that were on it; costs still come first.
    idle = [ws(3), ws(1), ws(0), ws(2)]
    idx = index_with()
    keys = [f"tenant-{k}" for k in range(40)]

    def pick(key, rank=0, routers=1, seed=0, workers=idle, index=idx):
        pol = make_policy("ttft", seed=seed)
        pol.choose(req(8), workers, index)  # an earlier tie moves nothing
        r = dataclasses.replace(req(8), cache_key=key, fleet=(rank, routers))
        return pol.choose(r, workers, index).worker_id

    home = {k: pick(k) for k in keys}
    assert all(
        pick(k, rank, 3, seed) == home[k] for k in keys[:10] for rank, seed in [(1, 5), (2, 9)]
    )
    assert set(home.values()) == {0, 1, 2, 3}
    three = [w for w in idle if w.worker_id != 2]
    moved = {k for k in keys if pick(k, workers=three) != home[k]}
    assert moved == {k for k in keys if home[k] == 2}
    # Not a pin: a worker with the prefix cached is cheaper, whatever the key says.
    holder = index_with(w1=8)
    assert {pick(k, index=holder) for k in keys} == {1}


def test_ttft_a_header_every_prompt_shares_does_not_draw_new_prompts_to_one_worker():
    """A chat template's first page, cached on one worker, is 0.8% of a 2,016-token prompt:
    below ttft's min_match (1%) it does not count, so idle workers tie exactly and new prompts
    spread; with min_match=0 the header sends every one of them to its holder."""
    header = index_with(w1=1)
    idle = [ws(i) for i in range(4)]
    picks = [make_policy("ttft", seed=s).choose(req(126), idle, header) for s in range(40)]
    assert {d.worker_id for d in picks} == {0, 1, 2, 3}
    assert all(len(set(d.scores.values())) == 1 for d in picks)  # an exact tie
    # what is cached on the chosen worker is still reported as it is (reuse telemetry)
    assert {d.predicted_cached_tokens for d in picks if d.worker_id == 1} == {P}
    assert {d.predicted_cached_tokens for d in picks if d.worker_id != 1} == {0}
    former = {
        make_policy("ttft", seed=s, min_match=0.0).choose(req(126), idle, header).worker_id
        for s in range(40)
    }
    assert former == {1}
    # A match that is a real share of the prompt still steers: 2 pages of 126 (1.6%), or the
    # same single page of a 128-token prompt (12.5%).
    for blocks, idx in ((126, index_with(w1=2)), (8, header)):
        chosen = {
            make_policy("ttft", seed=s).choose(req(blocks), idle, idx).worker_id for s in range(20)
        }
        assert chosen == {1}
    with pytest.raises(ValueError, match="min_match must be in"):
        make_policy("ttft", min_match=1.0)
    with pytest.raises(ValueError, match="min_match must be in"):
        make_policy("ttft:min_match=-0.1")
