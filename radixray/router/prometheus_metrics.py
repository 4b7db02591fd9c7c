"""Prometheus metrics of the router (one registry per app, so tests can run several)."""

from __future__ import annotations

import math
import threading
from collections import defaultdict

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from radixray.protocol import MISS_CAUSES

__all__ = ["RouterMetrics"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


_REUSE_HELP = (
    "Prompt tokens reusable by kind: available (the longest prefix any worker held, by the index "
    "at decision), captured (held by the chosen worker, by the index), delivered (actually reused: "
    "device hits and host loads); the *_host kinds are the parts only a host tier held or loaded"
)
_REUSE_ERROR_HELP = (
    "Delivered minus captured reuse, by sign: over (the index promised more than the worker had) "
    "and under (the worker had more than the index knew)"
)
_LOST_HELP = (
    "Blocks the workers evicted for good, as the router's index saw their KV events (kind=lost), "
    "and lost blocks a worker computed again while no other worker held them (kind=returned, "
    "within a horizon of the fleet's pages): returned / lost over a window is the rate ttft "
    "prices an evicted token at"
)
_HEADROOM_HELP = (
    "The fleet's spare prefill capacity as the routing policy estimates it: 1 - offered prefill "
    "work / capacity over the last ~64 requests (<= 0: saturated, queues grow); absent for "
    "policies that do not estimate it"
)
_QUEUE_HELP = (
    "Seconds a new request would wait before its prefill on the least-queued routable worker, at "
    "the workers' measured prefill rates; past the router's max_queue_s requests are refused (429)"
)
_REFUSED_HELP = "Requests refused (429) by the admission limit that refused them"
_HERDING_HELP = "1 while the router's decisions pile onto this worker and others sit idle"

# attribute, kind, metric name, help, label names; in the order /metrics lists them
_METRICS = (
    ("requests", Counter, "radixray_requests", "HTTP requests by route and status",
     ("route", "status")),
    ("ttft", Histogram, "radixray_ttft_seconds", "Time to first token", ()),
    ("latency", Histogram, "radixray_request_latency_seconds", "End-to-end latency", ()),
    ("prompt_tokens", Counter, "radixray_prompt_tokens", "Prompt tokens by miss cause",
     ("cause",)),
    ("completion_tokens", Counter, "radixray_completion_tokens", "Generated tokens", ()),
    ("hit_rate", Gauge, "radixray_cluster_hit_rate",
     "Cached prompt tokens / prompt tokens, all workers", ()),
    ("decisions", Counter, "radixray_decisions", "Routing decisions by reason and worker",
     ("reason", "worker")),
    ("mispredicted", Counter, "radixray_mispredicted_requests",
     "Requests whose actual cached tokens fell below the index's prediction", ()),
    ("reuse", Counter, "radixray_reuse_tokens", _REUSE_HELP, ("kind",)),
    ("reuse_error", Counter, "radixray_reuse_misprediction_tokens", _REUSE_ERROR_HELP,
     ("direction",)),
    ("retries", Counter, "radixray_retries", "Dispatches retried on another worker", ()),
    ("worker_load", Gauge, "radixray_worker_load", "Per-worker load as reported",
     ("worker", "field")),
    ("worker_pages", Gauge, "radixray_worker_pages", "Per-worker KV pages", ("worker", "kind")),
    ("worker_healthy", Gauge, "radixray_worker_healthy", "1 if routable", ("worker",)),
    ("index_entries", Gauge, "radixray_index_entries",
     "(block, worker) entries in the router's index", ()),
    ("index_memory", Gauge, "radixray_index_memory_bytes", "Router index memory", ()),
    ("index_lost", Counter, "radixray_index_lost_blocks", _LOST_HELP, ("kind",)),
    ("herded", Gauge, "radixray_herding", _HERDING_HELP, ("worker",)),
    ("headroom", Gauge, "radixray_fleet_headroom", _HEADROOM_HELP, ("policy",)),
    ("queue_wait", Gauge, "radixray_fleet_queue_seconds", _QUEUE_HELP, ()),
    ("refused", Counter, "radixray_refused_requests", _REFUSED_HELP, ("limit",)),
    ("herd_episodes", Counter, "radixray_herding_episodes",
     "Herding episodes noticed (see /debug/decisions)", ()),
)  # fmt: skip


class _Tally:
    """A registry's first collector: it collects nothing itself, but before the metrics that
    follow it are read it has ``flush`` add the counts tallied since the last read."""

    def __init__(self, flush):
        self._flush = flush

    def collect(self):
        self._flush()
        return ()

    def describe(self):
        return ()


class RouterMetrics:
    def __init__(self, router_id: str | None = None):
        r = self.registry = CollectorRegistry()
        self._lock = threading.Lock()
        self._tally: defaultdict = defaultdict(int)  # counter (or child) -> count to add
        r.register(_Tally(self.flush))  # first: read before every metric below
        if router_id is not None:
            Gauge(
                "radixray_router_info", "This router (1); its id names it", ["router"], registry=r
            ).labels(router_id).set(1)
        for attr, kind, name, doc, labels in _METRICS:
            extra = {"buckets": _LATENCY_BUCKETS} if kind is Histogram else {}
            setattr(self, attr, kind(name, doc, list(labels), registry=r, **extra))
        self._refused_seen: dict[str, int] = {}  # admission refusals already counted
        self._lost_seen: dict[str, int] = {}  # the index's lost / returned blocks, likewise
        for kind in ("lost", "returned"):  # shown from the start, at 0
            self.index_lost.labels(kind)
        # Labelled children are looked up once (a labels() call costs microseconds per request):
        # on_decision runs for every request.
        self._reuse = {
            k: self.reuse.labels(k)
            for k in (
                "available", "captured", "delivered",
                "available_host", "captured_host", "delivered_host",
            )
        }  # fmt: skip
        self._reuse_error = {k: self.reuse_error.labels(k) for k in ("over", "under")}
        self._by_cause = {c: self.prompt_tokens.labels(c) for c in MISS_CAUSES}
        self._by_decision: dict[tuple[str, str], object] = {}
        self._episodes_seen = 0
        self._prompt_total = 0
        self._cached_total = 0

    def on_decision(self, rec) -> None:
        """Count one finished decision. Its counters add up in ``_tally`` as plain numbers
        (~1 us a request; prometheus_client's locked values took ~5) until the registry is read
        (``_Tally``, ``flush``); the histograms observe at once."""
        key = (rec.reason, rec.worker_id)
        child = self._by_decision.get(key)
        if child is None:
            child = self._by_decision[key] = self.decisions.labels(*key)
        if rec.ttft_s is not None and rec.attempts and rec.finish_reason != "error":
            self.ttft.observe(rec.ttft_s)
        if rec.latency_s is not None:
            self.latency.observe(rec.latency_s)
        with self._lock:
            t = self._tally
            t[child] += 1
            if rec.attempts > 1:
                t[self.retries] += rec.attempts - 1
            if rec.completion_tokens:
                t[self.completion_tokens] += rec.completion_tokens
            if rec.miss:
                for cause, n in rec.miss.items():
                    if n:
                        t[self._by_cause.get(cause) or self.prompt_tokens.labels(cause)] += n
                self._prompt_total += rec.prompt_tokens
                self._cached_total += rec.actual_cached_tokens or 0
            delivered = rec.actual_cached_tokens
            if delivered is not None:
                reuse = self._reuse
                t[reuse["available"]] += rec.available_tokens
                t[reuse["captured"]] += rec.captured_tokens
                t[reuse["delivered"]] += delivered
                t[reuse["available_host"]] += rec.available_host_tokens
                t[reuse["captured_host"]] += rec.captured_host_tokens
                t[reuse["delivered_host"]] += (rec.miss or {}).get("host", 0)
                error = delivered - rec.captured_tokens
                if error:
                    t[self._reuse_error["under" if error > 0 else "over"]] += abs(error)
                if delivered < rec.predicted_cached_tokens:
                    t[self.mispredicted] += 1

    def flush(self) -> None:
        """Add the decisions' counts tallied since the last read to their counters (and the
        hit rate to its gauge). The registry calls it first whenever it is read, from the
        event loop (/metrics) or a thread (the fleet's store), hence the lock."""
        with self._lock:
            tally, self._tally = self._tally, defaultdict(int)
            prompt, cached = self._prompt_total, self._cached_total
        for counter, n in tally.items():
            counter.inc(n)
        if prompt:
            self.hit_rate.set(cached / prompt)

    def refresh_herding(self, alarm, worker_ids) -> None:
        for w in worker_ids:
            self.herded.labels(w).set(1 if alarm.herded(w) else 0)
        if alarm.episodes > self._episodes_seen:
            self.herd_episodes.inc(alarm.episodes - self._episodes_seen)
            self._episodes_seen = alarm.episodes

    def refresh(self, pool) -> None:
        """Copy the pool's latest worker reports, the prefill cost each worker is routed by
        (``pool.prefill_fits()``: pooled over its performance class) and the index size into
        gauges."""
        fits = pool.prefill_fits()
        for e in pool.workers.values():
            w = e.worker_id
            if w in fits:
                overhead, rate = fits[w]
                self.worker_load.labels(w, "routed_prefill_overhead_s").set(overhead)
                self.worker_load.labels(w, "routed_prefill_tokens_per_s").set(rate)
            self.worker_healthy.labels(w).set(1 if e.healthy and not e.draining else 0)
            for f in (
                "running",
                "waiting",
                "queued_prefill_tokens",
                "active_decode_tokens",
                "prefill_tokens_per_s",
                "decode_step_s",
                "decode_seq_s",
                "answer_tokens",
            ):
                v = getattr(e.report, f)
                if v is not None:
                    self.worker_load.labels(w, f).set(v)
            for kind in ("free_pages", "total_pages", "cached_pages", "evictable_pages"):
                v = getattr(e.report, kind)
                if v is not None:
                    self.worker_pages.labels(w, kind.removesuffix("_pages")).set(v)
        st = pool.index.stats()
        self.index_entries.set(st["entries"])
        self.index_memory.set(st["memory_bytes"])
        lost = {"lost": st["lost_blocks"], "returned": st["returned_blocks"]}
        _count_up(self.index_lost, self._lost_seen, lost)

    def refresh_headroom(self, policy) -> None:
        """The routing policy's current estimate of the fleet's headroom (policies without
        one, such as cache_aware, leave the gauge unset)."""
        h = getattr(policy, "headroom", None)
        if h is not None and math.isfinite(h):
            self.headroom.labels(policy.name).set(h)

    def refresh_admission(self, admission, queue_wait_s: float | None) -> None:
        """The admission's refusals since the last scrape, by limit, and the shortest queue
        a new request would join now (unset before the workers have measured a rate)."""
        _count_up(self.refused, self._refused_seen, admission.refused)
        if queue_wait_s is not None:
            self.queue_wait.set(queue_wait_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _count_up(counter, seen: dict[str, int], counts: dict[str, int]) -> None:
    """Bring a labelled counter up to running totals kept elsewhere, by label value (``seen``:
    the totals already counted)."""
    for key, count in counts.items():
        if count > seen.get(key, 0):
            counter.labels(key).inc(count - seen.get(key, 0))
        seen[key] = count
