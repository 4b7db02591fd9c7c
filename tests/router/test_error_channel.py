"""One error channel, end to end: every way a request can fail, through the real router app
over HTTP and real in-process engines (tiny model), is answered with one HTTP status and an
OpenAI error body (type, code, param, a clear message, Retry-After where a retry helps):

    client error (too long, bad ids)           400 invalid_request_error   no worker charged
    engine failed on one worker, first token   200 from the other worker   2 attempts recorded
    engine failed on two workers               500 server_error engine_failed
    no worker left (stopped engines, dead HTTP workers)
                                               503 service_unavailable no_worker + Retry-After
    too many requests in flight                429 rate_limit_error overloaded + Retry-After
    worker failed after the first token        SSE error event worker_failed, then [DONE];
                                               502 server_error worker_failed when not streaming

After each case no page is left behind on any worker.
"""

from __future__ import annotations

import json
import math
import threading
import time

import httpx
import openai
import pytest

from radixray.model_meta import load_model_meta
from radixray.protocol import WorkerClient
from radixray.protocol.http_transport import HttpTransport
from radixray.router.service import RouterService, RouterSettings

from .serving import LiveServer, StepGate, inprocess_service, worker_server

CONTEXT = 4096  # the tiny model's context length
VOCAB = 320
C = "/v1/completions"
CH = "/v1/chat/completions"
INJECTED = "injected forward failure"
ENGINE_ERROR = f"engine step failed: RuntimeError: {INJECTED}"


# ---------------------------------------------------------------------- helpers


def oai(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60)


def error_of(
    r: httpx.Response, status: int, type_: str, code: str | None, param: str | None = None
) -> dict:
    """The OpenAI error body of ``r``, checked: status, exact keys, type, code and param."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert (err["type"], err["code"], err["param"]) == (type_, code, param), err
    assert isinstance(err["message"], str) and err["message"], err
    return err


def decisions(http: httpx.Client, url: str) -> list[dict]:
    return http.get(f"{url}/debug/decisions?limit=1000").json()["decisions"]


def settle(hosts, service=None, timeout: float = 60) -> None:
    """Wait (with a deadline) until nothing is in flight, then prove no page leaked."""
    deadline = time.monotonic() + timeout
    while (service is not None and service.inflight) or any(
        h.engine.stats()["running"] or h.engine.stats()["waiting"] for h in hosts
    ):
        assert time.monotonic() < deadline, [h.engine.stats() for h in hosts]
        time.sleep(0.02)
    for h in hosts:
        h.engine.check_integrity()
        assert h.engine.cache.protected_tokens == 0, h.worker_id
        s = h.engine.stats()
        assert s["free_pages"] + s["cached_pages"] == s["total_pages"], s


def wait_healthy(http: httpx.Client, url: str, n: int, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        h = http.get(f"{url}/health")
        if h.json()["healthy_workers"] == n:
            return h
        assert time.monotonic() < deadline, h.json()
        time.sleep(0.02)


def fail_forward(host, when=lambda batch: True) -> None:
    """Fault injection on a real engine: its forward raises whenever ``when(batch)``. Freeing
    still works, so the engine ends the batch's requests with an ``EngineFailure`` and lives."""
    real = host.engine.runner.run

    def run(batch):
        if when(batch):
            raise RuntimeError(INJECTED)
        return real(batch)

    host.engine.runner.run = run


def fail_first_forward_anywhere(hosts) -> list[str]:
    """The first forward on any of ``hosts`` raises, once; returns [the worker it failed on]."""
    failed: list[str] = []
    lock = threading.Lock()
    for h in hosts:

        def once(batch, wid=h.worker_id):
            with lock:
                if failed:
                    return False
                failed.append(wid)
                return True

        fail_forward(h, once)
    return failed


def after_tokens(n: int):
    """A ``when`` for ``fail_forward``: the forward after a request has produced ``n`` tokens
    (so its first token, and the 200 response, are already out)."""
    return lambda batch: any(len(it.req.output_ids) >= n for it in batch.items)


def hold_after_first_token(hosts) -> list[StepGate]:
    """Each worker's first request stays in flight after its first token until its gate is
    released (see ``StepGate``): a test that needs requests in flight holds them, not times
    them."""
    return [StepGate(h) for h in hosts]


def shutdown(hosts) -> None:
    for h in hosts:
        h.shutdown()


# ---------------------------------------------------------------------- client errors


def test_client_errors_are_400_naming_the_field_and_charge_no_worker():
    service, hosts, clients = inprocess_service(2)
    try:
        with LiveServer(service, clients) as url, httpx.Client(timeout=60) as http:
            before = [h.engine.stats() for h in hosts]
            # A prompt longer than the context.
            r = http.post(url + C, json={"model": "tiny", "prompt": "z" * 5000})
            err = error_of(r, 400, "invalid_request_error", "context_length_exceeded", "prompt")
            assert err["message"] == (
                f"This model's maximum context length is {CONTEXT} tokens; the prompt has 5000"
            )
            assert "retry-after" not in r.headers
            # The same through the official client.
            with pytest.raises(openai.BadRequestError) as ei:
                oai(url).completions.create(model="tiny", prompt="z" * 5000)
            e = ei.value
            assert e.status_code == 400 and e.code == "context_length_exceeded"
            assert e.param == "prompt" and e.type == "invalid_request_error"
            assert str(CONTEXT) in e.message
            # Chat: the messages are what is too long.
            msgs = [{"role": "user", "content": "y" * 5000}]
            r = http.post(url + CH, json={"model": "tiny", "messages": msgs})
            err = error_of(r, 400, "invalid_request_error", "context_length_exceeded", "messages")
            assert err["message"].startswith(
                f"This model's maximum context length is {CONTEXT} tokens; the prompt has "
            )
            with pytest.raises(openai.BadRequestError) as ei:
                oai(url).chat.completions.create(model="tiny", messages=msgs)
            assert ei.value.code == "context_length_exceeded" and ei.value.param == "messages"
            # The prompt fits, but max_tokens does not fit after it.
            r = http.post(url + C, json={"model": "tiny", "prompt": "q" * 4090, "max_tokens": 16})
            err = error_of(r, 400, "invalid_request_error", "context_length_exceeded", "max_tokens")
            assert err["message"] == (
                "max_tokens is 16 but only 6 tokens fit after the 4090-token prompt "
                f"(context length {CONTEXT})"
            )
            # Token ids outside the vocabulary.
            r = http.post(url + C, json={"model": "tiny", "prompt": [1, 2, VOCAB]})
            err = error_of(r, 400, "invalid_request_error", None, "prompt")
            assert err["message"] == f"token id {VOCAB} is outside the vocabulary [0, {VOCAB})"
            with pytest.raises(openai.BadRequestError) as ei:
                oai(url).completions.create(model="tiny", prompt=[5, 10**6])
            assert ei.value.param == "prompt" and "outside the vocabulary" in ei.value.message

            # Refused at the edge: nothing was routed, admitted or run anywhere.
            assert decisions(http, url) == []
            assert service.inflight == 0
            assert all(not e.inflight for e in service.pool.workers.values())
            after = [h.engine.stats() for h in hosts]
            for b, a in zip(before, after, strict=True):
                for k in ("requests_finished", "prompt_tokens", "steps", "prefill_tokens"):
                    assert a[k] == b[k] == 0, (k, b, a)
            assert http.get(f"{url}/health").json()["healthy_workers"] == 2
        settle(hosts, service)
    finally:
        shutdown(hosts)


# ---------------------------------------------------------------------- engine failures


def test_engine_failure_before_the_first_token_is_retried_on_the_other_worker():
    service, hosts, clients = inprocess_service(2)
    failed = fail_first_forward_anywhere(hosts)
    try:
        with LiveServer(service, clients) as url, httpx.Client(timeout=60) as http:
            raw = oai(url).completions.with_raw_response.create(
                model="tiny", prompt="retry me elsewhere", max_tokens=3, temperature=0
            )
            assert raw.status_code == 200
            resp = raw.parse()
            assert resp.usage.completion_tokens == 3 and resp.choices[0].finish_reason == "length"
            assert len(failed) == 1
            bad = failed[0]
            good = ({"w0", "w1"} - {bad}).pop()
            assert raw.headers["x-radixray-worker"] == good
            recs = [d for d in decisions(http, url) if d["request_id"] == resp.id]
            assert [(d["attempts"], d["worker_id"]) for d in recs] == [(1, bad), (2, good)], recs
            assert recs[0]["error"] == f"worker {bad}: {ENGINE_ERROR}"
            assert recs[0]["finish_reason"] is None
            assert recs[1]["error"] is None and recs[1]["finish_reason"] == "length"
            # The failed engine freed the batch and lives on: both workers stay routable.
            assert all(h.engine.alive for h in hosts)
            assert http.get(f"{url}/health").json()["healthy_workers"] == 2
            settle(hosts, service)
    finally:
        shutdown(hosts)


def test_engine_failure_on_two_workers_is_500_engine_failed():
    service, hosts, clients = inprocess_service(2)
    for h in hosts:
        fail_forward(h)
    try:
        with LiveServer(service, clients) as url, httpx.Client(timeout=60) as http:
            r = http.post(url + C, json={"model": "tiny", "prompt": "poison", "max_tokens": 3})
            err = error_of(r, 500, "server_error", "engine_failed")
            assert "retry-after" not in r.headers
            recs = decisions(http, url)
            assert [d["attempts"] for d in recs] == [1, 2], recs
            assert {d["worker_id"] for d in recs} == {"w0", "w1"}
            assert len({d["request_id"] for d in recs}) == 1
            assert all(d["error"] == f"worker {d['worker_id']}: {ENGINE_ERROR}" for d in recs)
            last = recs[-1]["worker_id"]
            assert (
                err["message"] == f"the engine failed on 2 workers: worker {last}: {ENGINE_ERROR}"
            )
            with pytest.raises(openai.InternalServerError) as ei:
                oai(url).completions.create(model="tiny", prompt="poison", max_tokens=3)
            e = ei.value
            assert e.status_code == 500 and e.code == "engine_failed" and e.type == "server_error"
            assert "the engine failed on 2 workers" in e.message
            # A request that trips engines is not the workers' death: they stay up.
            assert all(h.engine.alive for h in hosts)
            assert http.get(f"{url}/health").json()["healthy_workers"] == 2
            settle(hosts, service)
    finally:
        shutdown(hosts)


def test_engine_failure_on_the_only_worker_is_500_engine_failed():
    service, hosts, clients = inprocess_service(1)
    fail_first_forward_anywhere(hosts)
    try:
        with LiveServer(service, clients) as url, httpx.Client(timeout=60) as http:
            r = http.post(url + C, json={"model": "tiny", "prompt": "only one", "max_tokens": 2})
            # The worker is there and healthy (it serves the next request): "no worker is
            # available" is not what happened.
            assert http.get(f"{url}/health").json()["healthy_workers"] == 1
            settle(hosts, service)
            err = error_of(r, 500, "server_error", "engine_failed")
            assert ENGINE_ERROR in err["message"]
            assert "retry-after" not in r.headers
    finally:
        shutdown(hosts)


# ---------------------------------------------------------------------- no worker left


def test_stopped_engines_leave_routing_then_503_no_worker_with_retry_after():
    service, hosts, clients = inprocess_service(2, retry_after_s=3)
    body = {"model": "tiny", "prompt": "who is still there?", "max_tokens": 2}
    try:
        with LiveServer(service, clients) as url, httpx.Client(timeout=60) as http:
            # w0's engine stops for good: its polls report it, and it leaves routing.
            hosts[0].engine.broken = "stopped by the test"
            wait_healthy(http, url, 1)
            for _ in range(4):
                r = http.post(url + C, json=body)
                assert r.status_code == 200, r.text
                assert r.headers["x-radixray-worker"] == "w1"
            assert all(d["worker_id"] == "w1" and d["error"] is None for d in decisions(http, url))
            # Then w1's too: nothing is left to serve.
            hosts[1].engine.broken = "stopped by the test"
            h = wait_healthy(http, url, 0)
            assert h.status_code == 503 and h.json()["status"] == "unavailable"
            n_before = len(decisions(http, url))
            r = http.post(url + C, json=body)
            err = error_of(r, 503, "service_unavailable", "no_worker")
            assert err["message"] == "No worker is available: no healthy worker"
            assert r.headers["retry-after"] == "3"
            r = http.post(
                url + CH, json={"model": "tiny", "messages": [{"role": "user", "content": "x"}]}
            )
            error_of(r, 503, "service_unavailable", "no_worker")
            assert r.headers["retry-after"] == "3"
            with pytest.raises(openai.InternalServerError) as ei:
                oai(url).completions.create(**body)
            e = ei.value
            assert e.status_code == 503 and e.code == "no_worker"
            assert e.response.headers["retry-after"] == "3"
            assert len(decisions(http, url)) == n_before  # nothing was dispatched
            assert service.inflight == 0
            settle(hosts, service)
    finally:
        shutdown(hosts)


def test_dead_http_workers_are_marked_down_retried_around_then_503():
    """Workers behind the real HTTP transport: a worker whose server is gone fails the request's
    dispatch (connection refused); the router marks it down and serves the request elsewhere;
    when both are gone, 503 no_worker."""
    (app0, h0), (app1, h1) = worker_server("w0"), worker_server("w1")
    hosts = [h0, h1]
    apps = {"w0": app0, "w1": app1}
    service = RouterService(
        load_model_meta("tiny"),
        RouterSettings(page_size=16, poll_interval_s=0.05, retry_after_s=2),
    )
    server = LiveServer(service)
    try:
        urls = [app0.__enter__(), app1.__enter__()]

        async def add_all():
            for u in urls:
                await service.add_worker(await WorkerClient.connect(HttpTransport(u)))

        with server as url, httpx.Client(timeout=60) as http:
            server.call(add_all())
            # Stop the pool's polls, so that it is the request that meets the dead worker.
            server.call(service.pool.stop())
            prefix = "a long shared system prompt that lands on one worker " * 3
            body = {"model": "tiny", "max_tokens": 2, "temperature": 0}
            r = http.post(url + C, json=body | {"prompt": prefix + "first"})
            assert r.status_code == 200, r.text
            home = r.headers["x-radixray-worker"]
            other = ({"w0", "w1"} - {home}).pop()
            apps[home].__exit__(None, None, None)
            # The prefix is cached on `home`, so the request goes there first, finds no one,
            # and is served by the other worker.
            r = http.post(url + C, json=body | {"prompt": prefix + "second"})
            assert r.status_code == 200, r.text
            assert r.headers["x-radixray-worker"] == other
            recs = [d for d in decisions(http, url) if d["request_id"] == r.json()["id"]]
            assert [(d["attempts"], d["worker_id"]) for d in recs] == [(1, home), (2, other)]
            assert recs[0]["error"].startswith(f"worker {home}: worker at ")
            assert recs[1]["error"] is None
            assert http.get(f"{url}/health").json()["healthy_workers"] == 1
            assert service.index.num_blocks(home) == 0  # what it held is forgotten
            for i in range(3):
                r = http.post(url + C, json=body | {"prompt": prefix + f"more {i}"})
                assert r.status_code == 200 and r.headers["x-radixray-worker"] == other
            # The other one goes too: the request finds it gone and nobody is left.
            apps[other].__exit__(None, None, None)
            r = http.post(url + C, json=body | {"prompt": prefix + "last"})
            err = error_of(r, 503, "service_unavailable", "no_worker")
            assert err["message"].startswith(f"No worker is available: worker {other}: ")
            assert r.headers["retry-after"] == "2"
            h = http.get(f"{url}/health")
            assert h.status_code == 503 and h.json()["healthy_workers"] == 0
            assert service.inflight == 0
        settle(hosts)
    finally:
        for a in apps.values():
            if getattr(a, "thread", None) is not None and a.thread.is_alive():
                a.__exit__(None, None, None)
        shutdown(hosts)


# ---------------------------------------------------------------------- overload

LONG = {
    "model": "tiny",
    "prompt": "a long answer, please",
    "max_tokens": 4000,
    "temperature": 0,
    "ignore_eos": True,
}


def open_stream(http: httpx.Client, url: str):
    """Start a long streaming request and return once it is in flight (its response began).
    Returns the stream's context manager (exit it to leave, which aborts the request)."""
    cm = http.stream("POST", url + C, json=LONG | {"stream": True})
    r = cm.__enter__()
    assert r.status_code == 200
    return cm, r.headers["x-radixray-worker"]


def test_overloaded_router_answers_429_with_retry_after():
    service, hosts, clients = inprocess_service(1, max_inflight=1, retry_after_s=4)
    (gate,) = hold_after_first_token(hosts)
    short = {"model": "tiny", "prompt": "me too", "max_tokens": 2}
    try:
        with LiveServer(service, clients) as url, httpx.Client(timeout=60) as http:
            cm, _ = open_stream(http, url)
            try:
                assert service.inflight == 1
                r = http.post(url + C, json=LONG)
                err = error_of(r, 429, "rate_limit_error", "overloaded")
                assert err["message"] == (
                    "The server is overloaded: 1 requests in flight (limit 1); retry later"
                )
                assert r.headers["retry-after"] == "4"
                with pytest.raises(openai.RateLimitError) as ei:
                    oai(url).completions.create(**short)
                e = ei.value
                assert e.status_code == 429 and e.code == "overloaded"
                assert e.type == "rate_limit_error" and e.response.headers["retry-after"] == "4"
                # Refused before routing: no attempt recorded (the one in flight records its
                # decision when it ends).
                assert len(service.router.dispatch.decisions) == 0
            finally:
                gate.release()
                cm.__exit__(None, None, None)  # the client leaves: the request is aborted
            settle(hosts, service)
            # The slot is free again.
            r = http.post(url + C, json=short)
            assert r.status_code == 200, r.text
            settle(hosts, service)
    finally:
        gate.release()
        shutdown(hosts)


def test_every_worker_at_its_inflight_limit_is_429_overloaded():
    service, hosts, clients = inprocess_service(
        2, policy="least_load", max_inflight_per_worker=1, retry_after_s=5
    )
    gates = hold_after_first_token(hosts)
    try:
        with LiveServer(service, clients) as url, httpx.Client(timeout=60) as http:
            first, w_first = open_stream(http, url)
            try:
                # One worker busy: the request goes to the other one.
                second, w_second = open_stream(http, url)
                try:
                    assert {w_first, w_second} == {"w0", "w1"}
                    r = http.post(url + C, json=LONG)
                    err = error_of(r, 429, "rate_limit_error", "overloaded")
                    assert err["message"] == (
                        "The server is overloaded: every worker has 1 requests in flight; "
                        "retry later"
                    )
                    assert r.headers["retry-after"] == "5"
                    with pytest.raises(openai.RateLimitError) as ei:
                        oai(url).chat.completions.create(
                            model="tiny", messages=[{"role": "user", "content": "hi"}]
                        )
                    assert ei.value.code == "overloaded"
                    assert ei.value.response.headers["retry-after"] == "5"
                    assert service.inflight == 2  # the refused ones released their slot
                finally:
                    for g in gates:
                        g.release()
                    second.__exit__(None, None, None)
            finally:
                first.__exit__(None, None, None)
            settle(hosts, service)
            r = http.post(url + C, json={"model": "tiny", "prompt": "room now", "max_tokens": 2})
            assert r.status_code == 200, r.text
            settle(hosts, service)
    finally:
        for g in gates:
            g.release()
        shutdown(hosts)


# ---------------------------------------------------------------------- after the first token


def test_a_queue_longer_than_max_queue_s_is_429_with_its_drain_time():
    """Admission by queueing delay: with the only worker held, a request dispatched to it
    queues its prefill; the next one would wait longer than ``max_queue_s`` at the worker's
    measured rate, so it is refused, counted by limit, and the same request is admitted once
    the queue has drained."""
    import concurrent.futures as cf
    import re

    service, hosts, clients = inprocess_service(1, max_queue_s=1e-6, retry_after_s=1)
    (gate,) = hold_after_first_token(hosts)
    short = {"model": "tiny", "prompt": "me too", "max_tokens": 2}
    queued = {"model": "tiny", "prompt": "q" * 3000, "max_tokens": 2}
    pool = cf.ThreadPoolExecutor(1)
    try:
        with LiveServer(service, clients) as url, httpx.Client(timeout=60) as http:
            cm, _ = open_stream(http, url)  # runs; the gate holds the engine after its prefill
            try:
                deadline = time.monotonic() + 60  # the worker's prefill rate, once polled
                while service.pool.queue_wait_s() is None:
                    assert time.monotonic() < deadline, "no measured prefill rate"
                    time.sleep(0.02)
                assert service.pool.queue_wait_s() == 0.0  # nothing queued yet: admitted
                waiting = pool.submit(http.post, url + C, json=queued)
                while service.pool.queue_wait_s() == 0.0:  # the router's tally has it
                    assert time.monotonic() < deadline and not waiting.done()
                    time.sleep(0.01)
                wait = service.pool.queue_wait_s()
                rate = service.pool.states()[0].prefill_tokens_per_s
                assert wait >= 2999 / rate  # its uncached prompt at the fitted rate
                r = http.post(url + C, json=short)
                err = error_of(r, 429, "rate_limit_error", "overloaded")
                assert re.fullmatch(
                    r"The server is overloaded: a new request would wait [0-9.]+ s before its "
                    r"prefill on the least-queued worker \(limit 1e-06 s, max_queue_s\); "
                    r"retry later",
                    err["message"],
                ), err["message"]
                assert r.headers["retry-after"] == str(max(1, math.ceil(wait - 1e-6)))
                with pytest.raises(openai.RateLimitError) as ei:
                    oai(url).completions.create(**short)
                assert ei.value.code == "overloaded"
                assert service.router.admission.refused == {
                    "inflight": 0,
                    "per_worker": 0,
                    "queue": 2,
                }
                metrics = http.get(url + "/metrics").text
                assert 'radixray_refused_requests_total{limit="queue"} 2.0' in metrics
                m = re.search(r"^radixray_fleet_queue_seconds ([0-9.e+-]+)$", metrics, re.M)
                assert m and float(m.group(1)) > 0, metrics
                assert len(service.router.dispatch.decisions) == 0  # refused before routing
            finally:
                gate.release()
                cm.__exit__(None, None, None)
            assert waiting.result().status_code == 200  # the queued one was served
            settle(hosts, service)
            r = http.post(url + C, json=short)  # the queue drained: admitted
            assert r.status_code == 200, r.text
            settle(hosts, service)
    finally:
        gate.release()
        pool.shutdown(wait=True)
        shutdown(hosts)


def sse_events(
    http: httpx.Client, url: str, body: dict, route: str = C
) -> tuple[httpx.Response, list]:
    """POST a streaming request; its SSE data payloads in order (JSON decoded, "[DONE]" kept)."""
    events = []
    with http.stream("POST", url + route, json=body | {"stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                events.append(data if data == "[DONE]" else json.loads(data))
    return r, events


def test_failure_after_the_first_token_ends_the_stream_with_an_error_event():
    service, hosts, clients = inprocess_service(1)
    fail_forward(hosts[0], after_tokens(3))
    body = {
        "model": "tiny",
        "prompt": "fail me midway",
        "max_tokens": 20,
        "temperature": 0,
        "ignore_eos": True,
    }
    try:
        with LiveServer(service, clients) as url, httpx.Client(timeout=60) as http:
            r, events = sse_events(http, url, body)
            assert r.status_code == 200 and r.headers["x-radixray-worker"] == "w0"
            assert events[-1] == "[DONE]"
            assert events[-2] == {
                "error": {
                    "message": ENGINE_ERROR,
                    "type": "server_error",
                    "param": None,
                    "code": "worker_failed",
                }
            }
            chunks = events[:-2]
            assert chunks and all(c["object"] == "text_completion" for c in chunks), events
            assert all(ch["finish_reason"] is None for c in chunks for ch in c["choices"])
            (rec,) = decisions(http, url)
            assert rec["finish_reason"] == "error" and rec["attempts"] == 1
            assert rec["error"] == f"worker w0 failed mid-stream: {ENGINE_ERROR}"
            settle(hosts, service)

            # The official client raises the stream's error once it reaches it.
            stream = oai(url).completions.create(
                model="tiny",
                prompt=body["prompt"],
                max_tokens=body["max_tokens"],
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            with pytest.raises(openai.APIError) as ei:
                for _ in stream:
                    pass
            e = ei.value
            assert e.code == "worker_failed" and e.type == "server_error"
            assert e.message == ENGINE_ERROR
            settle(hosts, service)

            # Not streaming: the response had not started, so it is a 502.
            r = http.post(url + C, json=body)
            err = error_of(r, 502, "server_error", "worker_failed")
            assert err["message"] == ENGINE_ERROR
            assert "retry-after" not in r.headers
            # Chat: the same error event after the role chunk, and the same 502.
            chat = {
                "model": "tiny",
                "messages": [{"role": "user", "content": "fail me midway"}],
                "max_tokens": 20,
                "temperature": 0,
                "ignore_eos": True,
            }
            r, events = sse_events(http, url, chat, CH)
            assert r.status_code == 200
            assert events[0]["object"] == "chat.completion.chunk"
            assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
            assert events[-2] == {
                "error": {
                    "message": ENGINE_ERROR,
                    "type": "server_error",
                    "param": None,
                    "code": "worker_failed",
                }
            }
            assert events[-1] == "[DONE]"
            assert all(ch["finish_reason"] is None for c in events[:-2] for ch in c["choices"])
            settle(hosts, service)
            r = http.post(url + CH, json=chat)
            assert error_of(r, 502, "server_error", "worker_failed")["message"] == ENGINE_ERROR
            # The worker is not to blame for good: it stays routable.
            assert http.get(f"{url}/health").json()["healthy_workers"] == 1
            assert hosts[0].engine.alive
            settle(hosts, service)
    finally:
        shutdown(hosts)
