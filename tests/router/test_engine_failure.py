"""A worker whose engine fails: requests that had produced nothing are served by another worker
(200, not a 400 blaming the client), and a worker whose engine stopped for good leaves routing."""

from __future__ import annotations

import time

import httpx

from radixray.router.policies.ttft import TERMS

from .serving import LiveServer, inprocess_service


def break_engine(host) -> None:
    """Fault injection on a real engine: its next forward raises, and freeing the failed
    request raises too, so the engine cannot restore its state and stops for good."""
    e = host.engine

    def boom(batch):
        raise RuntimeError("injected forward failure")

    def broken_abort(request_id):
        raise RuntimeError("injected failure while freeing")

    e.runner.run = boom
    e.scheduler.abort = broken_abort


def test_requests_on_a_failing_engine_are_retried_elsewhere_and_it_leaves_routing():
    service, hosts, clients = inprocess_service(2, poll_interval_s=0.05)
    try:
        with LiveServer(service, clients) as url, httpx.Client(timeout=60) as http:
            prefix = "a long shared system prompt that lands on one worker " * 3

            def complete(suffix: str) -> httpx.Response:
                body = {"model": "tiny", "prompt": prefix + suffix, "max_tokens": 3}
                r = http.post(f"{url}/v1/completions", json=body)
                assert r.status_code == 200, r.text
                return r

            home = complete("first").headers["x-radixray-worker"]
            other = ({"w0", "w1"} - {home}).pop()
            break_engine(hosts[int(home[1:])])
            # The prefix is cached on `home`, so the next request is routed there, fails in
            # its first step, and is served by the other worker; so is everything after it.
            served = [complete(f"question {i}").headers["x-radixray-worker"] for i in range(8)]
            assert set(served) == {other}
            decisions = http.get(f"{url}/debug/decisions?limit=50").json()["decisions"]
            failed = [d for d in decisions if d["worker_id"] == home and d["error"]]
            # ttft (the default) explains each decision: every candidate's terms, by name
            for d in decisions:
                assert d["worker_id"] in d["terms"] and d["terms"].keys() <= {"w0", "w1"}
                assert all(list(t) == list(TERMS) for t in d["terms"].values()), d
                assert d["decided_by"] in (*TERMS, "tie", "margin", "alone"), d
            assert failed and all(
                "engine step failed" in d["error"] or "engine stopped" in d["error"] for d in failed
            ), failed
            deadline = time.monotonic() + 30
            while http.get(f"{url}/health").json()["healthy_workers"] != 1:
                assert time.monotonic() < deadline, "the broken worker stayed routable"
                time.sleep(0.05)
        assert not hosts[int(home[1:])].engine.alive and hosts[int(other[1:])].engine.alive
    finally:
        for h in hosts:
            h.shutdown()


def test_a_request_that_fails_two_engines_is_a_500_not_retried_everywhere():
    # Every forward fails on every worker (as if this request tripped a kernel bug); freeing
    # works, so the engines stay up. The router retries once, then answers 500.
    service, hosts, clients = inprocess_service(3, poll_interval_s=0.05)
    try:
        for h in hosts:

            def boom(batch):
                raise RuntimeError("injected forward failure")

            h.engine.runner.run = boom
        with LiveServer(service, clients) as url, httpx.Client(timeout=60) as http:
            body = {"model": "tiny", "prompt": "poison", "max_tokens": 3}
            r = http.post(f"{url}/v1/completions", json=body)
            assert r.status_code == 500, r.text
            err = r.json()["error"]
            assert err["code"] == "engine_failed" and "on 2 workers" in err["message"]
            decisions = http.get(f"{url}/debug/decisions?limit=10").json()["decisions"]
            assert len([d for d in decisions if d["error"]]) == 2
            assert all(h.engine.alive for h in hosts)
            assert http.get(f"{url}/health").json()["healthy_workers"] == 3
    finally:
        for h in hosts:
            h.shutdown()
