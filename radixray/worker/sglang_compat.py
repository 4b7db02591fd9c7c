"""What SGLang's router (its gateway ``smg``, and ``sglang-router`` before it) needs of a worker.

It probes ``/health``, ``/server_info`` (or ``/get_server_info``), ``/model_info`` (or
``/get_model_info``), ``/v1/models``, and polls each worker's load from ``/v1/loads`` (SGLang's
load snapshot: smg reads the flat per-rank numbers, for its overload protection and the
load-aware policies); ``sglang-router``'s ``power_of_two`` read ``/get_load``, a JSON *list*. It
rebuilds OpenAI request bodies and adds its own extension fields (``skip_special_tokens: true``,
``ignore_eos: false``, ...). The OpenAI schema rejects unknown fields, so the fields that carry
the value that changes nothing for radixray are dropped; any other value still reaches the
schema, which either honours it (``ignore_eos: true``) or answers 400 naming the field.
See ``docs/peers/smg.md``.
"""

from __future__ import annotations

import datetime
import json
import time
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

from radixray.api.body import read_body, replay_body
from radixray.protocol import LoadReport, WorkerCounters, cache_view

if TYPE_CHECKING:
    from .http_server import WorkerServer

__all__ = [
    "SGLANG_NEUTRAL_FIELDS",
    "FILTERED_PATHS",
    "LOAD_SECTIONS",
    "DropNeutralFields",
    "probe",
    "loads",
    "cache_page",
]

# SGLang router extension fields and the value at which each is a no-op for radixray (plain
# sampling, no reasoning parser, no hidden states, stops trimmed, special tokens skipped).
SGLANG_NEUTRAL_FIELDS: dict[str, object] = {
    "no_stop_trim": False,
    "ignore_eos": False,
    "skip_special_tokens": True,
    "return_hidden_states": False,
    "continue_final_message": False,
    "separate_reasoning": True,
    "stream_reasoning": True,
}
FILTERED_PATHS = ("/v1/completions", "/v1/chat/completions")


def probe(path: str, server: WorkerServer, query: bytes = b"") -> tuple[int, object] | None:
    """``(status, JSON body)`` of an SGLang probe route, or None for any other path."""
    meta, engine = server.meta, server.host.engine
    if path == "/v1/loads":
        return loads(engine.stats(), engine.scheduler.config.max_running, query)
    if path in ("/server_info", "/get_server_info"):
        return 200, {
            "served_model_name": meta.name,
            "model_path": meta.name,
            "tokenizer_path": None,
            "context_length": meta.max_model_len,
            "page_size": engine.page_size,
            "worker_ids": [server.host.worker_id],
            "device": str(engine.device),
            "version": "radixray-0.1.0",
        }
    if path in ("/model_info", "/get_model_info"):
        return 200, {
            "model_path": meta.name,
            "tokenizer_path": None,
            "is_generation": True,
            "context_length": meta.max_model_len,
            "vocab_size": meta.vocab_size,
        }
    if path == "/get_load":
        # SGLang's shape: one entry per data-parallel rank; its router sums ``num_tokens``.
        s = engine.stats()
        return 200, [
            {
                "dp_rank": 0,
                "worker_id": server.host.worker_id,
                "num_reqs": s["running"] + s["waiting"],
                "num_waiting_reqs": s["waiting"],
                "num_tokens": s["queued_prefill_tokens"] + s["active_decode_tokens"],
            }
        ]
    return None


# The sections SGLang's /v1/loads can add to its core numbers (``?include=a,b``; "all": every
# one). This worker builds only ``queues``; asked for the others it leaves them out, as SGLang
# does with a section it cannot build. Any other name is a 400.
LOAD_SECTIONS = ("core", "memory", "spec", "lora", "disagg", "queues")


def loads(s: dict, max_running: int, query: bytes = b"") -> tuple[int, dict]:
    """SGLang's ``GET /v1/loads``: one data-parallel rank, the engine's ``stats()`` in SGLang's
    names. ``num_used_tokens`` are the tokens requests hold (cached pages that nothing holds are
    free to SGLang: evictable); ``token_usage`` is their share of the pool."""
    include = parse_qs(query.decode("latin-1")).get("include", ["core"])
    wanted = {x.strip() for part in include for x in part.split(",") if x.strip()}
    unknown = sorted(wanted - set(LOAD_SECTIONS) - {"all"})
    if unknown:
        expected = ", ".join((*LOAD_SECTIONS, "all"))
        return 400, {
            "error": f"include: unknown section {unknown[0]!r}; expected any of {expected}"
        }
    page, total = s["page_size"], s["total_pages"]
    used = (total - s["free_pages"] - s["evictable_pages"]) * page
    rate = s.get("decode_tokens_per_s") or 0.0
    rank = {
        "timestamp": time.time(),
        "dp_rank": 0,
        "num_running_reqs": s["running"],
        "num_waiting_reqs": s["waiting"],
        "num_waiting_uncached_tokens": s["queued_prefill_tokens"],
        "num_used_tokens": used,
        "max_total_num_tokens": total * page,
        "max_running_requests": max_running,
        "token_usage": used / (total * page) if total else 0.0,
        "gen_throughput": rate,
        "cache_hit_rate": s["hit_rate"] or 0.0,
        "utilization": used / (total * page) if total else 0.0,
    }
    if wanted & {"queues", "all"}:
        rank["queues"] = {"waiting": s["waiting"], "grammar": 0, "paused": 0, "retracted": 0}
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat()
    return 200, {"timestamp": stamp, "version": "radixray-0.1.0", "loads": [rank]}


def cache_page(worker_id: str, load: LoadReport, counters: WorkerCounters) -> dict:
    """``/debug/cache`` of a worker: the router's page's shape, with this one worker."""
    return {"workers": {worker_id: cache_view(load, counters)}}


class DropNeutralFields:
    """ASGI middleware: OpenAI POSTs reach the app with SGLang's neutral fields removed (and
    their Content-Length set to the new body's). It runs inside the body limit."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if not (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"] in FILTERED_PATHS
        ):
            return await self.app(scope, receive, send)
        body = await read_body(receive)
        if body is None:
            return  # the client left before sending its body
        if any(k.encode() in body for k in SGLANG_NEUTRAL_FIELDS):
            body = _strip_neutral(body)
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
            scope = dict(scope, headers=headers)
        await self.app(scope, replay_body(body, receive), send)


def _strip_neutral(data: bytes) -> bytes:
    try:
        obj = json.loads(data)
    except ValueError:
        return data  # not JSON: the route answers with its own 400
    if not isinstance(obj, dict):
        return data
    for key, neutral in SGLANG_NEUTRAL_FIELDS.items():
        if key in obj and obj[key] == neutral and type(obj[key]) is type(neutral):
            del obj[key]
    return json.dumps(obj).encode()
