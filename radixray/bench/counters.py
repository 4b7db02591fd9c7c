"""Cluster hit rate from the workers' own counters, not from what a router reports.

Each ``radixray worker`` serves ``/debug/cache`` with its engine's cumulative ``prompt_tokens``
and ``cached_tokens`` (refreshed by the worker app's own poll, every 0.25 s). A run's hit rate is
the difference of the sums over all workers after and before it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import httpx

__all__ = [
    "worker_counters",
    "worker_steps",
    "step_totals",
    "counter_delta",
    "merge_deltas",
    "COUNTER_KEYS",
]

COUNTER_KEYS = ("prompt_tokens", "cached_tokens", "evicted_pages", "preemptions")
# The worker app's poll interval (RouterSettings.poll_interval_s) plus margin: wait this long
# after a run before reading its counters, so the last requests are in them.
SETTLE_S = 0.8


async def _one(client: httpx.AsyncClient, url: str) -> dict:
    r = await client.get(url.rstrip("/") + "/debug/cache", timeout=10)
    r.raise_for_status()
    workers = r.json()["workers"]
    out = dict.fromkeys(COUNTER_KEYS, 0)
    out["miss_tokens"] = {}
    for st in workers.values():
        for k in COUNTER_KEYS:
            out[k] += int(st.get(k) or 0)
        for cause, n in (st.get("miss_tokens") or {}).items():
            out["miss_tokens"][cause] = out["miss_tokens"].get(cause, 0) + int(n or 0)
    return out


async def worker_counters(urls: Sequence[str]) -> dict[str, dict]:
    """``{url: {prompt_tokens, cached_tokens, ..., miss_tokens: {cause: n}}}``."""
    async with httpx.AsyncClient() as client:
        got = await asyncio.gather(*(_one(client, u) for u in urls))
    return dict(zip(urls, got, strict=True))


async def worker_steps(since: dict[str, tuple[int, int]] | None, urls=()) -> dict[str, dict]:
    """Each worker's step log and engine-side TTFTs (``/debug/steps``) after ``since[url] =
    (steps, first_tokens)``: ``{url: {steps, fields, log, first_tokens, ttft}}``. With ``since``
    None, the counts alone (of ``urls``)."""
    since = since or dict.fromkeys(urls, (10**18, 10**18))

    async def one(client: httpx.AsyncClient, url: str) -> dict:
        steps, firsts = since[url]
        r = await client.get(
            url.rstrip("/") + "/debug/steps",
            params={"since": steps, "ttft_since": firsts},
            timeout=30,
        )
        r.raise_for_status()
        return r.json()

    async with httpx.AsyncClient() as client:
        got = await asyncio.gather(*(one(client, u) for u in since))
    return dict(zip(since, got, strict=True))


def step_totals(steps: dict[str, dict]) -> dict:
    """A run's step logs (``worker_steps``) summed over the workers: steps, their forward and
    period seconds, prefill and decode tokens, and ``step_period_ms`` (period per step). The
    step count is set by the work (the tokens and the step budget), the period per step by the
    machine: two runs of the same work that differ in it ran on a faster or slower host."""
    out = dict.fromkeys(("steps", "prefill_tokens", "decode_tokens"), 0)
    out |= dict.fromkeys(("forward_s", "period_s"), 0.0)
    for d in steps.values():
        ix = {name: i for i, name in enumerate(d["fields"])}
        for x in d["log"]:
            out["steps"] += 1
            out["forward_s"] += x[ix["seconds"]]
            out["period_s"] += x[ix["period_s"]]
            out["prefill_tokens"] += x[ix["prefill_tokens"]]
            out["decode_tokens"] += x[ix["decode_batch"]]
    out["step_period_ms"] = 1000 * out["period_s"] / out["steps"] if out["steps"] else None
    return out


def counter_delta(before: dict[str, dict], after: dict[str, dict]) -> dict:
    """Per worker and total differences; ``hit_rate`` = cached / prompt tokens of the run."""
    per = {}
    for url, a in after.items():
        b = before.get(url, {})
        d = {k: a[k] - b.get(k, 0) for k in COUNTER_KEYS}
        bm = b.get("miss_tokens", {})
        d["miss_tokens"] = {c: n - bm.get(c, 0) for c, n in a.get("miss_tokens", {}).items()}
        per[url] = d
    total = {k: sum(d[k] for d in per.values()) for k in COUNTER_KEYS}
    causes: dict[str, int] = {}
    for d in per.values():
        for c, n in d["miss_tokens"].items():
            causes[c] = causes.get(c, 0) + n
    total["miss_tokens"] = causes
    total["hit_rate"] = (
        total["cached_tokens"] / total["prompt_tokens"] if total["prompt_tokens"] else 0.0
    )
    return {"total": total, "workers": per}


def merge_deltas(deltas: list[dict]) -> dict:
    """Several runs' ``counter_delta`` results as one (totals summed; workers per run)."""
    total = {k: sum(d["total"][k] for d in deltas) for k in COUNTER_KEYS}
    causes: dict[str, int] = {}
    for d in deltas:
        for c, n in d["total"]["miss_tokens"].items():
            causes[c] = causes.get(c, 0) + n
    total["miss_tokens"] = causes
    prompt = total["prompt_tokens"]
    total["hit_rate"] = total["cached_tokens"] / prompt if prompt else 0.0
    return {"total": total, "workers": [d["workers"] for d in deltas]}
