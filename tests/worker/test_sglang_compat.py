"""What SGLang's router needs of a worker: probe shapes and its extension fields."""

from __future__ import annotations

import httpx

from radixray.worker.sglang_compat import loads

# The fields sglang-router 0.3.2 adds when it rebuilds a request (observed on the wire).
SGLANG_COMPLETION_EXTRAS = {
    "echo": False,
    "no_stop_trim": False,
    "ignore_eos": False,
    "skip_special_tokens": True,
    "return_hidden_states": False,
}
SGLANG_CHAT_EXTRAS = {
    "logprobs": False,
    "no_stop_trim": False,
    "ignore_eos": False,
    "continue_final_message": False,
    "skip_special_tokens": True,
    "separate_reasoning": True,
    "stream_reasoning": True,
    "return_hidden_states": False,
}


def test_probe_shapes(worker_app):
    url, _ = worker_app
    with httpx.Client(base_url=url, timeout=10) as c:
        assert c.get("/health").status_code == 200
        for path in ("/server_info", "/get_server_info"):
            info = c.get(path).json()
            assert info["served_model_name"] == "tiny" and info["worker_ids"] == ["w0"]
        for path in ("/model_info", "/get_model_info"):
            assert c.get(path).json()["model_path"] == "tiny"
        load = c.get("/get_load").json()
        assert isinstance(load, list) and len(load) == 1
        assert isinstance(load[0]["num_tokens"], int) and load[0]["worker_id"] == "w0"


def test_sglang_rebuilt_requests_are_accepted(worker_app):
    url, _ = worker_app
    with httpx.Client(base_url=url, timeout=30) as c:
        body = {"model": "tiny", "prompt": "hello", "max_tokens": 2, "temperature": 0.0}
        r = c.post("/v1/completions", json=body | SGLANG_COMPLETION_EXTRAS | {"stream": False})
        assert r.status_code == 200, r.text
        chat = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "max_completion_tokens": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with c.stream("POST", "/v1/chat/completions", json=chat | SGLANG_CHAT_EXTRAS) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data:")]
        assert r.status_code == 200 and lines[-1] == "data: [DONE]"
        assert '"usage"' in lines[-2]
        # A value that would change behaviour is not silently dropped: 400 naming the field.
        r = c.post("/v1/completions", json=body | {"return_hidden_states": True})
        assert r.status_code == 400 and r.json()["error"]["param"] == "return_hidden_states"


def _stats(**kw) -> dict:
    pool = {"page_size": 16, "total_pages": 100, "free_pages": 60, "evictable_pages": 30}
    load = {"running": 2, "waiting": 3, "queued_prefill_tokens": 500}
    return pool | load | {"decode_tokens_per_s": 40.0, "hit_rate": 0.25} | kw


def test_v1_loads_counts_what_requests_hold_as_sglang_does():
    status, body = loads(_stats(), max_running=64, query=b"include=core,disagg,queues,memory")
    assert status == 200
    (rank,) = body["loads"]
    # 100 pages of 16: 60 free and 30 cached that nothing holds (evictable) leave 10 held.
    assert rank["num_used_tokens"] == 160 and rank["max_total_num_tokens"] == 1600
    assert rank["token_usage"] == 0.1
    assert (rank["num_running_reqs"], rank["num_waiting_reqs"]) == (2, 3)
    assert rank["num_waiting_uncached_tokens"] == 500 and rank["max_running_requests"] == 64
    assert rank["queues"]["waiting"] == 3
    assert "memory" not in rank and "disaggregation" not in rank  # sections it cannot build
    status, body = loads(_stats(), 64, b"include=core")
    assert "queues" not in body["loads"][0]
    status, body = loads(_stats(), 64, b"include=core,gpu")
    assert status == 400 and "'gpu'" in body["error"] and "queues" in body["error"]


def test_v1_loads_served_by_a_worker(worker_app):
    url, _ = worker_app
    with httpx.Client(base_url=url, timeout=10) as c:
        r = c.get("/v1/loads", params={"include": "core,disagg,queues,memory"})
        assert r.status_code == 200, r.text
        (rank,) = r.json()["loads"]
        assert rank["dp_rank"] == 0 and rank["num_running_reqs"] == 0
        assert rank["max_total_num_tokens"] > 0 and 0.0 <= rank["token_usage"] <= 1.0
        assert c.get("/v1/loads", params={"include": "nope"}).status_code == 400
