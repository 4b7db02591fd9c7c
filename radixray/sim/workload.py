"""Workloads for the simulator: the Mooncake trace format, Azure arrivals with shared prefixes, and
multi-turn chat with Zipf session popularity.

A request's prompt is a list of *segments* ``(segment_id, length)``: equal segment ids at equal
positions mean equal tokens, so prefix sharing is exact. Tokens are made on demand (a request's
token list is built when a worker needs it and dropped after), from a per-workload table that gives
every segment its own range of token ids::

    segment 7, length 16  ->  tokens [base(7), base(7) + 1, ..., base(7) + 15]

A segment used with different lengths (Mooncake's partial last block) uses a prefix of its range,
so a partial block is a prefix of the full one, as it would be in text.
"""

from __future__ import annotations

import csv
import itertools
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from radixray.cache_index import hash_blocks

from .data import MOONCAKE_BLOCK_TOKENS, azure_trace_path, mooncake_trace_path, read_mooncake

__all__ = [
    "SimRequest",
    "Workload",
    "load_mooncake",
    "resolve_trace",
    "azure_shared_prefix",
    "multiturn_chat",
    "hot_prefix",
    "MOONCAKE_BLOCK_TOKENS",
]


class SimRequest:
    """One request of a workload (immutable by convention; per-run state lives in the worker)."""

    __slots__ = ("rid", "arrival", "segments", "num_tokens", "output_len", "session", "output_seg")

    def __init__(
        self,
        rid: int,
        arrival: float,
        segments: tuple[tuple[int, int], ...],
        output_len: int,
        session: str | None = None,
        output_seg: int | None = None,
    ):
        self.rid = rid
        self.arrival = arrival
        self.segments = segments
        self.num_tokens = sum(n for _, n in segments)
        self.output_len = max(1, output_len)
        self.session = session
        # When set, the generated tokens are this segment (a chat answer that the next turn's
        # prompt repeats) and the worker caches them at the end, as a real engine does.
        self.output_seg = output_seg

    def __repr__(self) -> str:
        return (
            f"SimRequest(rid={self.rid}, arrival={self.arrival:.3f}, tokens={self.num_tokens}, "
            f"output={self.output_len}, segments={len(self.segments)})"
        )


@dataclass
class Workload:
    """Requests sorted by arrival, and the token table their segments draw from.

    ``first_block_tokens`` is the size of the shared "block 0" excluded by the
    ``hit_rate_beyond_first_block`` metric.
    """

    name: str
    requests: list[SimRequest]
    first_block_tokens: int
    description: dict = field(default_factory=dict)
    _base: dict[int, int] = field(default_factory=dict, repr=False)
    _seg_len: dict[int, int] = field(default_factory=dict, repr=False)
    _next: int = field(default=1, repr=False)
    _hash_cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        self.requests.sort(key=lambda r: (r.arrival, r.rid))
        for r in self.requests:
            for seg, n in r.segments:
                self._reserve(seg, n)
            if r.output_seg is not None:
                self._reserve(r.output_seg, r.output_len)

    def _reserve(self, seg: int, n: int) -> None:
        have = self._seg_len.get(seg)
        if have is None:
            self._base[seg] = self._next
            self._seg_len[seg] = n
            self._next += n
        elif n > have:
            # Grow the segment's range: move it to the end (nothing was generated from it yet).
            self._base[seg] = self._next
            self._seg_len[seg] = n
            self._next += n
        if self._next >= 2**31:
            raise ValueError("workload needs more than 2**31 distinct token ids")

    def __len__(self) -> int:
        return len(self.requests)

    def tokens(self, req: SimRequest) -> list[int]:
        base = self._base
        out: list[int] = []
        for seg, n in req.segments:
            b = base[seg]
            out.extend(range(b, b + n))
        return out

    def output_tokens(self, req: SimRequest) -> list[int]:
        if req.output_seg is None:
            return []
        b = self._base[req.output_seg]
        return list(range(b, b + req.output_len))

    def block_hashes(self, page_size: int) -> list[list[int]]:
        """``hash_blocks(prompt, page_size)`` per request (computed once per page size)."""
        hashes = self._hash_cache.get(page_size)
        if hashes is None:
            hashes = [hash_blocks(self.tokens(r), page_size) for r in self.requests]
            self._hash_cache[page_size] = hashes
        return hashes

    def head(self, n: int) -> Workload:
        """The first ``n`` requests (a short slice for tests and notebooks)."""
        reqs = self.requests[:n]
        return Workload(
            self.name, list(reqs), self.first_block_tokens, {**self.description, "limit": n}
        )

    def total_tokens(self) -> int:
        return sum(r.num_tokens for r in self.requests)


# ------------------------------------------------------------------ Mooncake format


def resolve_trace(trace: str | Path) -> Path:
    """``"mooncake"`` names the shared conversation trace; anything else is a path."""
    if str(trace) == "mooncake":
        path = mooncake_trace_path()
        if not path.exists():
            raise FileNotFoundError(
                f"the Mooncake trace is not at {path}; set RADIXRAY_DATA_DIR to the folder that "
                "holds mooncake/conversation_trace.jsonl"
            )
        return path
    path = Path(trace).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"trace file not found: {path}")
    return path


def _spread(timestamps: list[float], rng: random.Random) -> list[float]:
    """Spread requests that share a rounded timestamp evenly-at-random over the gap to the next
    distinct timestamp, keeping file order (the trace rounds arrivals to ~3 s buckets)."""
    out = list(timestamps)
    n = len(out)
    i = 0
    while i < n:
        j = i
        while j < n and timestamps[j] == timestamps[i]:
            j += 1
        if j - i > 1:
            nxt = (
                timestamps[j]
                if j < n
                else timestamps[i] + (timestamps[i] - timestamps[0]) / max(1, i)
            )
            gap = max(0.0, nxt - timestamps[i])
            offs = sorted(rng.random() * gap for _ in range(j - i))
            for k in range(i, j):
                out[k] = timestamps[i] + offs[k - i]
        i = j
    return out


def load_mooncake(
    trace: str | Path = "mooncake",
    block_tokens: int = 16,
    speedup: float = 1.0,
    output_scale: float | None = None,
    limit: int | None = None,
    seed: int = 0,
    spread: bool = True,
) -> Workload:
    """Load a JSONL trace in the Mooncake format (timestamp ms, input_length, output_length,
    hash_ids over 512-token blocks).

    Each hash id becomes one segment of ``block_tokens`` tokens: the block-size scale factor is
    ``512 / block_tokens`` (16 -> 32x smaller prompts) and input lengths are scaled by it.
    ``output_scale`` divides output lengths (default: the same factor, which keeps the trace's
    prefill-to-decode ratio). ``speedup`` compresses time (2.0 -> arrivals twice as fast).
    The session key is the conversation's first block after the shared block 0.
    """
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    if speedup <= 0:
        raise ValueError(f"speedup must be > 0, got {speedup}")
    scale = MOONCAKE_BLOCK_TOKENS / block_tokens
    oscale = scale if output_scale is None else output_scale
    path = resolve_trace(trace)
    rows = list(itertools.islice(read_mooncake(path), limit))
    rng = random.Random(seed)
    ts = [r.timestamp_ms / 1000.0 for r in rows]
    if spread:
        ts = _spread(ts, rng)
    reqs = []
    for i, (row, t) in enumerate(zip(rows, ts, strict=True)):
        hids, inp, out = row.hash_ids, row.input_length, row.output_length
        n = len(hids)
        length = max(1, round(inp / scale))
        # Keep the length consistent with the block count: the last block is partial.
        length = min(max(length, (n - 1) * block_tokens + 1), n * block_tokens)
        segs = [(h, block_tokens) for h in hids[:-1]]
        segs.append((hids[-1], length - (n - 1) * block_tokens))
        session = str(row.conversation)
        reqs.append(SimRequest(i, t / speedup, tuple(segs), max(1, round(out / oscale)), session))
    return Workload(
        "mooncake" if str(trace) == "mooncake" else path.stem,
        reqs,
        block_tokens,
        {
            "trace": str(path),
            "block_tokens": block_tokens,
            "scale": scale,
            "output_scale": oscale,
            "speedup": speedup,
        },
    )


# ------------------------------------------------------------------ Azure + shared prefix


def _azure_rows(service: str, limit: int | None) -> list[tuple[float, int, int]]:
    path = azure_trace_path(service)
    if not path.exists():
        raise FileNotFoundError(f"the Azure trace is not at {path} (set RADIXRAY_DATA_DIR)")
    rows = []
    t0 = None
    with open(path, newline="") as f:
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
    import bisect

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


def iter_tokens(workload: Workload) -> Iterable[list[int]]:
    for r in workload.requests:
        yield workload.tokens(r)
