"""Workloads for the simulator: requests as segments, and the Mooncake trace format (generated
workloads are in generators.py).

A request's prompt is a list of *segments* ``(segment_id, length)``: equal segment ids at equal
positions mean equal tokens, so prefix sharing is exact. Tokens are made on demand (a request's
token list is built when a worker needs it and dropped after), from a per-workload table that gives
every segment its own range of token ids::

    segment 7, length 16  ->  tokens [base(7), base(7) + 1, ..., base(7) + 15]

A segment used with different lengths (Mooncake's partial last block) uses a prefix of its range,
so a partial block is a prefix of the full one, as it would be in text. A *literal* segment has
its tokens given instead (``Workload.literal``: a live run's exact token ids, replayed); made-up
ranges then start above every literal id, so the two never collide.

A request with ``after`` set is one turn of a conversation: it arrives when the request ``after``
(its previous turn) finishes, or at ``arrival`` if that is later, as a client that waits for an
answer before it sends the next turn.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from radixray.cache_index import hash_blocks

from .data import MOONCAKE_BLOCK_TOKENS, display_path, mooncake_trace_path, read_mooncake

__all__ = [
    "SimRequest",
    "Workload",
    "load_mooncake",
    "resolve_trace",
    "MOONCAKE_BLOCK_TOKENS",
]


class SimRequest:
    """One request of a workload (immutable by convention; per-run state lives in the worker)."""

    __slots__ = (
        "rid",
        "arrival",
        "segments",
        "num_tokens",
        "output_len",
        "session",
        "output_seg",
        "after",
    )

    def __init__(
        self,
        rid: int,
        arrival: float,
        segments: tuple[tuple[int, int], ...],
        output_len: int,
        session: str | None = None,
        output_seg: int | None = None,
        after: int | None = None,
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
        # When set, the rid of the request whose finish releases this one (closed loop).
        self.after = after

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
    literal: dict[int, tuple[int, ...]] = field(default_factory=dict, repr=False)
    _base: dict[int, int] = field(default_factory=dict, repr=False)
    _seg_len: dict[int, int] = field(default_factory=dict, repr=False)
    _next: int = field(default=1, repr=False)
    _memo: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        self.requests.sort(key=lambda r: (r.arrival, r.rid))
        if self.literal:
            self._next = max(self._next, 1 + max(max(v, default=0) for v in self.literal.values()))
        seen: set[int] = set()
        for r in self.requests:
            if r.after is not None and r.after not in seen:
                raise ValueError(
                    f"request {r.rid}: after={r.after} must name a request earlier in the "
                    "workload (by arrival, then rid)"
                )
            seen.add(r.rid)
            for seg, n in r.segments:
                self._reserve(seg, n)
            if r.output_seg is not None:
                self._reserve(r.output_seg, r.output_len)

    def _reserve(self, seg: int, n: int) -> None:
        lit = self.literal.get(seg)
        if lit is not None:
            if n > len(lit):
                raise ValueError(f"segment {seg} is used with {n} tokens but has {len(lit)}")
            return
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
        base, literal = self._base, self.literal
        out: list[int] = []
        for seg, n in req.segments:
            lit = literal.get(seg)
            if lit is not None:
                out.extend(lit[:n])
            else:
                b = base[seg]
                out.extend(range(b, b + n))
        return out

    def output_tokens(self, req: SimRequest) -> list[int]:
        if req.output_seg is None:
            return []
        lit = self.literal.get(req.output_seg)
        if lit is not None:
            return list(lit[: req.output_len])
        b = self._base[req.output_seg]
        return list(range(b, b + req.output_len))

    def block_hashes(self, page_size: int) -> list[list[int]]:
        """``hash_blocks(prompt, page_size)`` per request (computed once per page size)."""
        return self.memo(
            ("block_hashes", page_size),
            lambda: [hash_blocks(self.tokens(r), page_size) for r in self.requests],
        )

    def memo(self, key, compute):
        """``compute()``, once per ``key`` for this workload: what every policy's run of it
        shares (block hashes, the ceiling's and the pooled cache's hits)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def head(self, n: int) -> Workload:
        """The first ``n`` requests (a short slice for tests and notebooks)."""
        reqs = self.requests[:n]
        return Workload(
            self.name,
            list(reqs),
            self.first_block_tokens,
            {**self.description, "limit": n},
            self.literal,
        )

    def total_tokens(self) -> int:
        return sum(r.num_tokens for r in self.requests)


# ------------------------------------------------------------------ Mooncake format


def resolve_trace(trace: str | Path) -> Path:
    """``"mooncake"`` names the Mooncake conversation trace shipped in the package (or under
    ``$RADIXRAY_DATA_DIR``); anything else is a path to a JSONL file, plain or ``.gz``."""
    if str(trace) == "mooncake":
        return mooncake_trace_path()
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
        "mooncake" if str(trace) == "mooncake" else Path(path.name.removesuffix(".gz")).stem,
        reqs,
        block_tokens,
        {
            "trace": display_path(path),
            "block_tokens": block_tokens,
            "scale": scale,
            "output_scale": oscale,
            "speedup": speedup,
        },
    )


def iter_tokens(workload: Workload) -> Iterable[list[int]]:
    for r in workload.requests:
        yield workload.tokens(r)
