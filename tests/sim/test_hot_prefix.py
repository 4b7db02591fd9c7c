"""One hot system prompt at a rate above one worker's capacity: ttft replicates it onto as many
workers as the load needs (no hotspot), with a TTFT p99 no worse than least_load's and a hit
rate within 5% of cache_aware's (smg 1.13's rule: its spill gate moves the prompt off a holder
once its load passes the fleet's mean by about two standard deviations); SGLang's router of
January (cache_aware_v03) kept it on a few workers and queued."""

from __future__ import annotations

import collections

from radixray.sim import SimConfig, hot_prefix, simulate


def test_ttft_replicates_a_hot_prefix_instead_of_making_a_hotspot():
    # 500 requests: 50 s of arrivals, the hot prompt's at 8/s from the first second. 1,500 gave
    # the same verdicts at three times the cost (seeds 1-3), and no weaker ones: a ttft that
    # keeps the prompt on its holders (ttft:reuse_weight=20) fails the spread check here too,
    # where over 1,500 it had spread by the end and failed only the p99 ones.
    wl = hot_prefix(num_requests=500, rate=10.0, seed=1)
    cfg = SimConfig(num_workers=8, num_pages=4096, page_size=16)
    policies = ("least_load", "cache_aware", "cache_aware_v03", "ttft")
    runs = {p: simulate(wl, p, cfg) for p in policies}
    s = {p: r.summary() for p, r in runs.items()}

    def hot_share_by_worker(policy: str) -> list[float]:
        hot = [
            r for r, q in zip(runs[policy].records, wl.requests, strict=True) if q.session == "hot"
        ]
        counts = collections.Counter(r.worker for r in hot)
        return sorted((n / len(hot) for n in counts.values()), reverse=True)

    ttft_shares = hot_share_by_worker("ttft")
    # spread over at least half the fleet, no worker taking much more than its share of those
    # (it was six workers while queues counted cached prompts whole: benchmarks/HISTORY.md,
    # "Queued work net of the cache")
    assert len(ttft_shares) >= 4 and ttft_shares[0] <= 0.3
    assert s["ttft"]["ttft_p99"] <= s["least_load"]["ttft_p99"]
    assert s["ttft"]["hit_rate"] >= 0.95 * s["cache_aware"]["hit_rate"]
    assert s["ttft"]["ttft_p99"] <= s["cache_aware"]["ttft_p99"]
    # ... and the workload is a real hotspot: pure affinity replicates the prompt only once a
    # worker is imbalanced past the old router's thresholds, and its tail is far worse.
    assert s["cache_aware_v03"]["ttft_p99"] > 2 * s["ttft"]["ttft_p99"]
