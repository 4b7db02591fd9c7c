"""The load generator: replays a workload against any OpenAI-compatible endpoint, streaming.

Two ways to apply load:

* ``rate``: sessions start at Poisson arrivals of ``rate`` sessions/s (seeded), open loop; the
  turns of one session still go one after another (a turn needs the previous answer).
* ``concurrency``: ``concurrency`` users, closed loop; each runs one session at a time.

Per request it measures TTFT (the first chunk that carries text), the gaps between later text
chunks (inter-token latency), end-to-end time, and from the final usage chunk the prompt, cached
and completion tokens; with ``return_token_ids`` also the prompt's token ids as the engine saw
them and the ids it sampled (radixray and vLLM). Both limits are hard: at most
``max_requests`` requests are sent, nothing new starts after ``max_duration_s`` and whatever is
still running ``drain_s`` later is cancelled (counted as an error).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Literal

import httpx

from .workloads import BenchWorkload, Session

__all__ = [
    "LoadConfig",
    "RequestResult",
    "RunResult",
    "run_load",
    "session_starts",
    "stream_request",
]


@dataclass(frozen=True)
class LoadConfig:
    mode: Literal["rate", "concurrency"] = "concurrency"
    rate: float = 4.0  # sessions per second (mode "rate")
    concurrency: int = 8  # users (mode "concurrency")
    max_requests: int = 1000
    max_duration_s: float = 600.0
    drain_s: float = 60.0
    request_timeout_s: float = 120.0
    temperature: float = 0.0
    seed: int = 0
    progress: bool = True
    return_token_ids: bool = False  # ask for and keep every request's token ids

    def __post_init__(self):
        if self.mode not in ("rate", "concurrency"):
            raise ValueError(f"mode must be 'rate' or 'concurrency', got {self.mode!r}")
        if self.mode == "rate" and not self.rate > 0:
            raise ValueError(f"rate must be > 0, got {self.rate}")
        if self.mode == "concurrency" and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.max_requests < 1 or not self.max_duration_s > 0:
            raise ValueError("max_requests must be >= 1 and max_duration_s > 0")


@dataclass
class RequestResult:
    session_id: str
    turn: int
    start_s: float  # since the run started
    ok: bool = False
    error: str | None = None
    status: int | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    shared_prefix_tokens: int = 0
    worker: str | None = None  # x-radixray-worker, when the endpoint is radixray
    endpoint: str | None = None  # which URL served it (several routers: see run_load)
    text: str = ""
    prompt_ids: list[int] | None = None  # with return_token_ids
    output_ids: list[int] | None = None

    def as_dict(self) -> dict:
        d = asdict(self)
        d["itl_s"] = [round(x, 6) for x in self.itl_s]
        d.pop("text")
        if self.prompt_ids is None:
            del d["prompt_ids"], d["output_ids"]
        return d


@dataclass
class RunResult:
    target: str
    url: str
    config: LoadConfig
    requests: list[RequestResult]
    duration_s: float
    started_at: float


def _endpoint(body: dict) -> str:
    return "/v1/chat/completions" if "messages" in body else "/v1/completions"


def _text_of(chunk: dict) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    c = choices[0]
    if "delta" in c:
        return (c.get("delta") or {}).get("content") or ""
    return c.get("text") or ""


async def stream_request(
    client: httpx.AsyncClient, url: str, body: dict, result: RequestResult, timeout_s: float
) -> RequestResult:
    """Send one streaming request; fill ``result`` (never raises for HTTP or stream errors)."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    t0 = time.perf_counter()
    last = None
    parts: list[str] = []
    try:
        async with client.stream("POST", url + _endpoint(body), json=body, timeout=timeout_s) as r:
            result.status = r.status_code
            result.worker = r.headers.get("x-radixray-worker")
            if r.status_code != 200:
                result.error = f"HTTP {r.status_code}: {(await r.aread())[:300]!r}"
                return result
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = str(chunk["error"])[:300]
                    return result
                text = _text_of(chunk)
                now = time.perf_counter()
                if body.get("return_token_ids"):
                    _take_ids(chunk, result)
                if text:
                    if result.ttft_s is None:
                        result.ttft_s = now - t0
                    else:
                        result.itl_s.append(now - last)
                    last = now
                    parts.append(text)
                usage = chunk.get("usage")
                if usage:
                    result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                    result.completion_tokens = int(usage.get("completion_tokens") or 0)
                    details = usage.get("prompt_tokens_details") or {}
                    result.cached_tokens = int(details.get("cached_tokens") or 0)
        result.e2e_s = time.perf_counter() - t0
        if result.ttft_s is None:  # no text at all (e.g. an immediate stop): first byte = end
            result.ttft_s = result.e2e_s
        result.text = "".join(parts)
        result.ok = result.error is None
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        result.error = f"{type(e).__name__}: {e}"[:300]
    return result


def session_starts(rate: float, seed: int) -> Iterator[float]:
    """When mode "rate" starts each session, in seconds from the run's start: Poisson arrivals
    of ``rate`` per second from a generator seeded with ``seed`` (a replay of a run, such as
    bench_sim_vs_live.py's, draws the same times from here)."""
    rng, t = random.Random(seed), 0.0
    while True:
        t += rng.expovariate(rate)
        yield t


def _take_ids(chunk: dict, result: RequestResult) -> None:
    """A chunk's ``return_token_ids`` fields: the prompt's ids (on a completion choice or
    beside a chat chunk's choices, once) and the sampled ids."""
    choices = chunk.get("choices") or []
    prompt = chunk.get("prompt_token_ids")
    if prompt is None and choices:
        prompt = choices[0].get("prompt_token_ids")
    if prompt is not None:
        result.prompt_ids = list(prompt)
    if choices:
        if result.output_ids is None:
            result.output_ids = []
        result.output_ids.extend(choices[0].get("token_ids") or ())


class _Budget:
    """Shared request count and deadline."""

    def __init__(self, cfg: LoadConfig, t0: float):
        self.left = cfg.max_requests
        self.deadline = t0 + cfg.max_duration_s

    def take(self) -> bool:
        if self.left <= 0 or time.perf_counter() >= self.deadline:
            return False
        self.left -= 1
        return True


async def run_load(
    url: str,
    workload: BenchWorkload,
    cfg: LoadConfig,
    model: str = "tiny",
    target: str = "",
    pick_url: Callable[[], str] | None = None,
) -> RunResult:
    """Replay ``workload`` against ``url`` (the server root, without ``/v1``). ``pick_url``:
    called for every request to choose its endpoint instead (several routers of one fleet)."""
    from tqdm.auto import tqdm

    url = url.rstrip("/")
    results: list[RequestResult] = []
    total = min(cfg.max_requests, workload.num_requests)
    bar = tqdm(total=total, desc=target or url, unit="req", disable=not cfg.progress, leave=False)
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=1024)
    started_at = time.time()
    t0 = time.perf_counter()
    budget = _Budget(cfg, t0)

    async with httpx.AsyncClient(limits=limits, timeout=cfg.request_timeout_s) as client:

        async def run_session(s: Session) -> None:
            answers: list[str] = []
            for turn in range(len(s.turns)):
                if not budget.take():
                    return
                body = s.request_body(model, turn, answers)
                body["temperature"] = cfg.temperature
                if cfg.return_token_ids:
                    body["return_token_ids"] = True
                res = RequestResult(
                    s.session_id,
                    turn,
                    time.perf_counter() - t0,
                    shared_prefix_tokens=s.shared_prefix_tokens,
                )
                results.append(res)
                res.endpoint = pick_url().rstrip("/") if pick_url else url
                await stream_request(client, res.endpoint, body, res, cfg.request_timeout_s)
                bar.update(1)
                if not res.ok:
                    return  # a later turn would need this answer
                answers.append(res.text)

        tasks: list[asyncio.Task] = []
        if cfg.mode == "rate":
            starts = session_starts(cfg.rate, cfg.seed)
            for s in workload.sessions:
                if budget.left <= 0:
                    break
                next_t = t0 + next(starts)
                delay = next_t - time.perf_counter()
                if next_t >= budget.deadline:
                    break
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(run_session(s)))
        else:
            queue = iter(workload.sessions)

            async def user():
                for s in queue:
                    if budget.left <= 0 or time.perf_counter() >= budget.deadline:
                        return
                    await run_session(s)

            tasks = [asyncio.create_task(user()) for _ in range(cfg.concurrency)]
        remaining = budget.deadline + cfg.drain_s - time.perf_counter()
        _, pending = await asyncio.wait(tasks, timeout=max(remaining, 0.0)) if tasks else ((), ())
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
    for r in results:
        if not r.ok and r.error is None:
            r.error = "cancelled at the run's time limit"
    bar.close()
    return RunResult(target, url, cfg, results, time.perf_counter() - t0, started_at)
