"""Generated workloads for the simulator: Azure arrivals with shared prefixes, multi-turn chat
with Zipf session popularity, and one hot system prompt."""

from __future__ import annotations

import bisect
import csv
import math
import random
from datetime import datetime

from .data import azure_trace_path, open_text
from .workload import SimRequest, Workload

__all__ = ["azure_shared_prefix", "hot_prefix", "multiturn_chat"]


# ------------------------------------------------------------------ Azure + shared prefix


def _azure_rows(service: str, limit: int | None) -> list[tuple[float, int, int]]:
    path = azure_trace_path(service)
    rows = []
    t0 = None
    with open_text(path, newline="") as f:
        for rec in csv.DictReader(f):
            stamp = rec["TIMESTAMP"].strip()
            # Seven fractional digits: datetime takes six.
            if "." in stamp:
                head, frac = stamp.split(".")
                stamp = f"{head}.{frac[:6]}"
            t = datetime.fromisoformat(stamp).timestamp()
            if t0 is None:
                t0 = t
            rows.append((t - t0, int(rec["ContextTokens"]), int(rec["GeneratedTokens"])))
            if limit is not None and len(rows) >= limit:
                break
    return rows


def azure_shared_prefix(
    num_requests: int = 2000,
    num_groups: int = 16,
    system_len: int = 256,
    question_scale: float = 32.0,
    max_question_len: int = 512,
    output_scale: float = 8.0,
    speedup: float = 1.0,
    service: str = "conv",
    seed: int = 0,
) -> Workload:
    """Azure LLM inference arrivals with a generated shared prefix (like SGLang's
    generated-shared-prefix benchmark): each request picks one of ``num_groups`` system prompts
    of ``system_len`` tokens (uniformly, seeded), then a unique question whose length is the
    Azure context length / ``question_scale`` (at most ``max_question_len``); output length is
    the Azure generated length / ``output_scale``."""
    rows = _azure_rows(service, num_requests)
    rng = random.Random(seed)
    reqs = []
    for i, (t, ctx, gen) in enumerate(rows):
        g = rng.randrange(num_groups)
        q = min(max_question_len, max(1, math.ceil(ctx / question_scale)))
        segs = ((-(g + 1), system_len), (1_000_000 + i, q))
        reqs.append(SimRequest(i, t / speedup, segs, max(1, round(gen / output_scale)), str(g)))
    return Workload(
        f"azure_{service}_shared_prefix",
        reqs,
        system_len,
        {"groups": num_groups, "system_len": system_len, "speedup": speedup},
    )


# ------------------------------------------------------------------ multi-turn chat


def _zipf_cdf(n: int, s: float) -> list[float]:
    w = [1.0 / (k**s) for k in range(1, n + 1)]
    tot = sum(w)
    acc = 0.0
    out = []
    for x in w:
        acc += x / tot
        out.append(acc)
    return out


def multiturn_chat(
    num_requests: int = 2000,
    num_sessions: int = 200,
    zipf_s: float = 1.1,
    rate: float = 4.0,
    system_len: int = 64,
    user_len: tuple[int, int] = (16, 96),
    answer_len: tuple[int, int] = (8, 48),
    max_turns: int = 12,
    seed: int = 0,
) -> Workload:
    """Poisson arrivals at ``rate`` per second; each picks a session by Zipf(``zipf_s``)
    popularity and sends its next turn: the shared system prompt, the whole history (user turns
    and the answers the model gave) and a new user message. A session restarts after
    ``max_turns``. Answers are cached by the worker when generated, so the next turn can hit."""
    rng = random.Random(seed)
    cdf = _zipf_cdf(num_sessions, zipf_s)
    history: dict[int, list[tuple[int, int]]] = {}
    epoch: dict[int, int] = {}
    seg_id = 1
    t = 0.0
    reqs = []
    for i in range(num_requests):
        t += rng.expovariate(rate)
        s = min(bisect.bisect_left(cdf, rng.random()), num_sessions - 1)
        hist = history.setdefault(s, [])
        if len(hist) >= 2 * max_turns:
            hist.clear()
            epoch[s] = epoch.get(s, 0) + 1
        user = (seg_id, rng.randint(*user_len))
        ans = (seg_id + 1, rng.randint(*answer_len))
        seg_id += 2
        segs = ((0, system_len), *hist, user)
        reqs.append(SimRequest(i, t, segs, ans[1], f"{s}.{epoch.get(s, 0)}", output_seg=ans[0]))
        hist.extend((user, ans))
    return Workload(
        "multiturn_chat",
        reqs,
        system_len,
        {"sessions": num_sessions, "zipf_s": zipf_s, "rate": rate, "max_turns": max_turns},
    )


# ------------------------------------------------------------------ one hot system prompt


def hot_prefix(
    num_requests: int = 3000,
    rate: float = 10.0,
    hot_share: float = 0.8,
    num_cold: int = 16,
    system_len: int = 1024,
    question_len: tuple[int, int] = (32, 128),
    output_len: tuple[int, int] = (8, 24),
    seed: int = 0,
) -> Workload:
    """One system prompt carries most of the traffic: Poisson arrivals at ``rate`` per second;
    a request uses the hot system prompt with probability ``hot_share``, else one of
    ``num_cold`` others (uniformly), then a unique question. At the defaults the hot prompt
    brings 8 requests/s, more than one CPU-preset worker serves (at 4.8/s, cache_aware keeping
    it on two workers already queues for seconds), so a router that keeps it where it was
    cached first makes a hotspot: it must be replicated onto as many workers as its load needs.
    """
    rng = random.Random(seed)
    t = 0.0
    reqs = []
    for i in range(num_requests):
        t += rng.expovariate(rate)
        hot = rng.random() < hot_share
        g = 0 if hot else 1 + rng.randrange(num_cold)
        segs = ((-(g + 1), system_len), (2_000_000 + i, rng.randint(*question_len)))
        reqs.append(SimRequest(i, t, segs, rng.randint(*output_len), "hot" if hot else str(g)))
    return Workload(
        "hot_prefix",
        reqs,
        system_len,
        {"rate": rate, "hot_share": hot_share, "num_cold": num_cold, "system_len": system_len},
    )
