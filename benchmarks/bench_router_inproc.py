"""The router's own Python per request, in process: ``radixray serve``'s app (edge, routing,
dispatch, metrics, the worker client) over two stub workers whose transport answers at once
from pre-encoded frames, driven through ASGI with no sockets, uvicorn or worker in the way.

``bench_router.py`` measures a whole router process against smg's on a shared machine, where
the run-to-run spread (~15%) hides a change of a few percent; this isolates the part of the CPU
our code spends (~80% of the process's), with hot caches, so a change to the request path can be
timed before and after (run it on both commits, alternating). Per load shape (``max_tokens=1``
whole answers; 64-token streams, each token its own chunk): ``--requests`` requests with
``--concurrency`` in flight, process CPU time per request in microseconds, the median of
``--repeats`` runs. The prompts are bench_router's (8 shared 256-character prefixes, a unique
suffix each); a stub worker reports the page-aligned prompt as cached, as a warm worker would,
so the router's prediction holds and it polls no one mid-run.

    .venv/bin/python benchmarks/bench_router_inproc.py                # ~1 min
    .venv/bin/python benchmarks/bench_router_inproc.py --quick        # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

from bench_router import prompts

from radixray.cache_index.events import EventBatch, encode_events
from radixray.model_meta import load_model_meta
from radixray.protocol import GenerateRequest, StreamChunk, WorkerClient
from radixray.protocol.codec import decode, encode
from radixray.protocol.messages import Ack, LoadReport, PollResult, WorkerCounters, WorkerInfo
from radixray.router.app import build_app
from radixray.router.service import RouterService, RouterSettings

SHAPES = {
    "max_tokens=1": {"max_tokens": 1, "stream": False},
    "64-token stream": {"max_tokens": 64, "stream": True, "ignore_eos": True},
}
PAGE = 16


class StubTransport:
    """A worker that answers every call at once: its info, an empty poll, and each generate
    request's ``max_tokens`` chunks (one token each, a loop turn apart, the last with usage)."""

    def __init__(self, worker_id: str):
        self.address = self.worker_id = worker_id
        self.seq = 0
        self.mid = encode(StreamChunk([5], "ab", 0))

    async def call(self, method: str, payload: bytes, timeout_s: float) -> bytes:
        if method == "info":
            return encode(
                WorkerInfo(self.worker_id, "e", "tiny", PAGE, 2048, 320, "radix", 768, "cpu", "")
            )
        if method == "poll":
            self.seq += 1
            events = encode_events(EventBatch(self.worker_id, self.seq, 0.0, []))
            load = LoadReport(free_pages=700, total_pages=768)
            return encode(
                PollResult(self.worker_id, "e", self.seq, self.seq == 1, events, True, load,
                           WorkerCounters())
            )  # fmt: skip
        return encode(Ack())

    async def stream(self, method: str, payload: bytes):
        req = decode(payload, GenerateRequest)
        n, k = len(req.prompt_ids), req.params.max_tokens
        cached = (n - 1) // PAGE * PAGE
        for _ in range(k - 1):
            await asyncio.sleep(0)
            yield self.mid
        await asyncio.sleep(0)
        miss = {"cached": cached, "cold": n - cached}
        yield encode(StreamChunk([5], "a", cached, "length", n, k, miss))

    async def close(self) -> None:
        pass


async def _request(app, body: bytes) -> int:
    """One POST /v1/completions through the app; returns its status."""
    sent: list[dict] = []
    forever = asyncio.get_running_loop().create_future()
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        if messages:
            return messages.pop()
        await forever  # the client stays until the answer ends
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
        "query_string": b"", "root_path": "", "headers": headers,
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
    }  # fmt: skip
    await app(scope, receive, send)
    forever.cancel()
    return sent[0]["status"]


async def _load(app, bodies: list[bytes], concurrency: int) -> int:
    """Every body once, ``concurrency`` in flight; returns the failures (status != 200)."""
    todo = list(reversed(bodies))
    failed = 0

    async def user():
        nonlocal failed
        while todo:
            failed += await _request(app, todo.pop()) != 200

    await asyncio.gather(*(user() for _ in range(concurrency)))
    return failed


async def run(args) -> dict:
    service = RouterService(
        load_model_meta("tiny"), RouterSettings(policy=args.policy, max_inflight=1 << 16)
    )
    for i in range(2):
        await service.add_worker(WorkerClient(StubTransport(f"w{i}"), f"w{i}"))
    app = build_app(service, manage_lifecycle=False)
    texts = prompts(args.requests * (args.repeats + 1))
    out: dict = {}
    for name, shape in SHAPES.items():
        n = args.requests if name == "max_tokens=1" else max(1, args.requests // 4)
        bodies = [
            json.dumps({"model": "tiny", "prompt": t, "temperature": 0.0} | shape).encode()
            for t in texts[: n * (args.repeats + 1)]
        ]
        failed = await _load(app, bodies[:n], args.concurrency)  # warm
        runs = []
        for r in range(1, args.repeats + 1):
            c0 = time.process_time()
            failed += await _load(app, bodies[r * n : (r + 1) * n], args.concurrency)
            runs.append((time.process_time() - c0) / n * 1e6)
        out[name] = {"us_per_request": statistics.median(runs), "runs": runs, "failed": failed}
        print(f"{name:16} {statistics.median(runs):7.1f} us/request (runs "
              f"{', '.join(f'{x:.1f}' for x in runs)}), failed {failed}", flush=True)  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--policy", default="ttft")
    p.add_argument("--out", default="/tmp/bench_router_inproc")
    p.add_argument("--quick", action="store_true", help="a smoke run: 80 requests, 2 repeats")
    args = p.parse_args(argv)
    if args.quick:
        args.requests, args.repeats = 80, 2
    from radixray.api.server import loop_factory, settle_gc

    settle_gc()  # as a serving router does once started
    factory = loop_factory() or asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        res = runner.run(run(args))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_router_inproc.json").write_text(json.dumps({"args": vars(args)} | res))
    return 1 if any(v["failed"] for v in res.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
