"""The TTFT bound (whole infinite-cache prefix hit, idle worker): exact where nothing queues and
one cache holds everything, never beaten under load, and in every report. The pooled-cache
reference (one LRU cache of the cluster's pages): the infinite cache's hits when nothing is
evicted, fewer when the cache is small."""

from __future__ import annotations

import json

import pytest

from radixray.sim import SimConfig, load_mooncake, simulate
from radixray.sim.results import ceiling_hits, percentile, pooled_hits, ttft_bound
from radixray.sim.sim_cli import main
from tests.sim.test_simulator import BT, write_trace


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bound")
    rows = write_trace(folder / "busy.jsonl", n=240, seed=3)
    with open(folder / "idle.jsonl", "w") as f:
        for i, row in enumerate(rows):  # the same requests, 100 s apart: nothing ever queues
            f.write(json.dumps(row | {"timestamp": i * 100_000}) + "\n")
    return folder / "busy.jsonl", folder / "idle.jsonl"


def test_one_idle_worker_with_room_for_everything_meets_the_bound_exactly(traces):
    wl = load_mooncake(traces[1], block_tokens=BT)
    cfg = SimConfig(num_workers=1, num_pages=8192, page_size=BT)
    result = simulate(wl, "ttft", cfg)
    hits = ceiling_hits(wl, BT)
    assert [r.cached for r in result.records] == hits
    bound = ttft_bound(wl, BT, cfg.timing)
    assert result.bound == bound
    for rec, b in zip(result.records, bound, strict=True):
        assert rec.ttft == pytest.approx(b, rel=1e-9, abs=1e-12)
    s = result.summary()
    assert s["excess_p50"] == pytest.approx(0, abs=1e-9) and s["excess_p99"] == pytest.approx(
        0, abs=1e-9
    )
    assert s["delay_p99"] == pytest.approx(0, abs=1e-9) and s["delay_mean"] == pytest.approx(
        0, abs=1e-9
    )


@pytest.mark.parametrize("policy", ["round_robin", "cache_aware", "ttft"])
def test_no_request_beats_its_bound_under_load(traces, policy):
    wl = load_mooncake(traces[0], block_tokens=BT, speedup=8.0)
    result = simulate(wl, policy, SimConfig(num_workers=3, num_pages=256, page_size=BT))
    for rec, b in zip(result.records, result.bound, strict=True):
        assert rec.ttft >= b - 1e-9
    s = result.summary()
    assert s["bound_p50"] <= s["ttft_p50"] and s["bound_p99"] <= s["ttft_p99"]
    assert s["excess_p99"] == pytest.approx(s["ttft_p99"] - s["bound_p99"])
    # per request: each one's TTFT minus its own bound, then the percentiles of that
    delays = [rec.ttft - b for rec, b in zip(result.records, result.bound, strict=True)]
    for q in (50, 90, 99):
        assert s[f"delay_p{q}"] == pytest.approx(max(0.0, percentile(delays, q)), abs=1e-12)
    assert s["delay_mean"] == pytest.approx(sum(delays) / len(delays), abs=1e-9)
    assert 0 <= s["delay_p50"] <= s["delay_p90"] <= s["delay_p99"] and s["delay_p99"] > 0


def test_the_bound_is_in_the_table_and_the_json(traces, tmp_path, capsys):
    out = tmp_path / "o.json"
    argv = ["--trace", str(traces[0]), "--workers", "3", "--pages", "256", "--speedup", "8"]
    argv += ["--policies", "round_robin,cache_aware_v03:fallback=smallest_cache", "--no-progress"]
    assert main([*argv, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert set(data) == {"round_robin", "cache_aware_v03:fallback=smallest_cache"}
    for s in data.values():
        assert 0 < s["bound_p50"] <= s["bound_p90"] <= s["bound_p99"] <= s["ttft_p99"]
        assert s["excess_p50"] == pytest.approx(max(0.0, s["ttft_p50"] - s["bound_p50"]))
        assert 0 <= s["delay_p50"] <= s["delay_p99"] <= s["ttft_p99"]
    table = capsys.readouterr().out
    lines = table.splitlines()
    assert "xs p50" in table and lines[-2].startswith("bound ")
    assert lines[-1].startswith("pooled cache ")
    for s in data.values():
        assert s["pooled_ttft_p50"] >= s["bound_p50"] and 0 <= s["pooled_hit_rate"] <= 1
    assert main(["--policies", "cache_aware:fallbak=x", "--no-progress"]) == 2
    assert "has no parameter 'fallbak'" in capsys.readouterr().err


def test_a_pooled_cache_that_holds_everything_hits_what_the_infinite_one_does(traces):
    from radixray.sim import multiturn_chat

    for wl in (load_mooncake(traces[0], block_tokens=BT), multiturn_chat(num_requests=200)):
        assert pooled_hits(wl, BT, 1_000_000) == ceiling_hits(wl, BT)


def test_a_small_pooled_cache_hits_less_and_its_ttft_is_above_the_bound(traces):
    wl = load_mooncake(traces[0], block_tokens=BT, speedup=8.0)
    small, infinite = pooled_hits(wl, BT, 3 * 64), ceiling_hits(wl, BT)
    assert all(a <= b for a, b in zip(small, infinite, strict=True))
    assert sum(small) < sum(infinite)
    result = simulate(wl, "ttft", SimConfig(num_workers=3, num_pages=64, page_size=BT))
    assert result.pooled_tokens == sum(small)
    assert result.pooled_ttft == ttft_bound(wl, BT, result_timing(), small)
    s = result.summary()
    assert s["pooled_hit_rate"] == sum(small) / sum(r.num_tokens for r in wl.requests)
    assert s["pooled_ttft_p50"] >= s["bound_p50"] and s["pooled_ttft_p99"] >= s["bound_p99"]
    assert s["pooled_excess_p50"] == pytest.approx(max(0.0, s["ttft_p50"] - s["pooled_ttft_p50"]))


def result_timing():
    return SimConfig().timing
