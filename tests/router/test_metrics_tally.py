"""``RouterMetrics.on_decision`` tallies its counters as plain numbers until the registry is
read: every read (``/metrics``, the fleet's store from a thread) sees each decision exactly once."""

from __future__ import annotations

import threading

from radixray.router.dispatch import DecisionRecord
from radixray.router.prometheus_metrics import RouterMetrics


def _record(i: int) -> DecisionRecord:
    return DecisionRecord(
        f"r{i}", f"w{i % 2}", "r", "ttft: best match", 100, 64,
        actual_cached_tokens=48, available_tokens=64, captured_tokens=64, completion_tokens=3,
        ttft_s=0.01, latency_s=0.02, finish_reason="length", miss={"cached": 48, "cold": 52},
    )  # fmt: skip


def _value(m: RouterMetrics, name: str, labels: dict | None = None) -> float:
    return m.registry.get_sample_value(name, labels or {}) or 0.0


def test_each_read_sees_every_decision_once():
    m = RouterMetrics("r")
    for i in range(5):
        m.on_decision(_record(i))
    labels = {"reason": "ttft: best match", "worker": "w0"}
    assert _value(m, "radixray_decisions_total", labels) == 3  # w0: decisions 0, 2, 4
    assert _value(m, "radixray_decisions_total", labels) == 3  # a second read adds nothing
    m.on_decision(_record(6))
    assert _value(m, "radixray_decisions_total", labels) == 4
    assert _value(m, "radixray_completion_tokens_total") == 18
    assert _value(m, "radixray_reuse_misprediction_tokens_total", {"direction": "over"}) == 96
    assert _value(m, "radixray_mispredicted_requests_total") == 6
    assert _value(m, "radixray_cluster_hit_rate") == 0.48
    assert b'radixray_prompt_tokens_total{cause="cold"} 312.0' in m.render()


def test_a_read_from_another_thread_loses_no_count():
    m, done = RouterMetrics("r"), threading.Event()

    def scrape():
        while not done.is_set():
            list(m.registry.collect())

    reader = threading.Thread(target=scrape)
    reader.start()
    try:
        for i in range(4000):
            m.on_decision(_record(i))
    finally:
        done.set()
        reader.join()
    assert _value(m, "radixray_completion_tokens_total") == 3 * 4000
