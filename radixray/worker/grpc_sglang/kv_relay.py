"""The worker's KV events as SGLang's gateway subscribes to them (``SubscribeKvEvents``).

One relay per gRPC server. Its pump polls the worker host like any router does (``poll``
with its own cursor, so radixray's own routers polling the same host lose nothing) and turns
each non-empty poll into one ``KvEventBatch`` numbered by the relay: ``BlockStored`` becomes
``KvBlocksStored`` (one ``KvBlock`` per page with its token ids, ``block_size`` = the page size,
the chained hashes as the engine computed them), ``BlockRemoved`` ``KvBlocksRemoved`` and
``AllBlocksCleared`` ``KvCacheCleared``. The host's first answer is a snapshot (a clear, then
every cached chain), so the relay's first batch starts from a clear.

The gateway's stream rules (smg 1.13.0, ``kv_event_recovery.rs``): batches are numbered
monotonically; a subscriber sends the last sequence it applied (0: none) and the stream resumes
strictly after it. The relay keeps the last ``LOG_BATCHES`` batches to replay a reconnect from,
and a mirror of the live blocks: a subscriber with no cursor, one the log no longer reaches, one
from another incarnation of the worker (the relay numbers from the wall clock at start, so a
restarted worker's numbers are past its predecessor's) or one that fell behind gets the live set
as a state snapshot (``KvSnapshotChunk``: chunks stamped with consecutive sequence numbers
ending at the relay's current one, the first beginning with a clear, parents before children),
then the live batches after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable

from radixray.cache_index.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    decode_events,
)
from radixray.protocol import PollRequest

from . import smg_common_pb2 as pb

__all__ = ["KvEventRelay", "to_proto_events", "signed64", "LOG_BATCHES", "SNAPSHOT_CHUNK_BLOCKS"]

LOG_BATCHES = 4096  # batches kept to replay a reconnect from
SNAPSHOT_CHUNK_BLOCKS = 4096  # blocks per snapshot chunk (smg reads up to 64 MiB a message)
POLL_INTERVAL_S = 0.1  # the pump's idle cadence; a finished prefill wakes it at once (kick)
HOST_MEDIUM = "CPU"  # radixray's host tier in events (cache_index.host_tier); else the device


def signed64(h: int) -> int:
    """A 64-bit unsigned hash as the int64 the gateway's messages carry (same bits)."""
    return h - (1 << 64) if h >= 1 << 63 else h


def _tier(medium: str | None) -> int:
    return pb.KV_CACHE_TIER_HOST if medium == HOST_MEDIUM else pb.KV_CACHE_TIER_DEVICE


def _stored(ev: BlockStored) -> pb.KvBlocksStored:
    P = ev.block_size
    out = pb.KvBlocksStored(
        blocks=[
            pb.KvBlock(
                block_hash=signed64(h), token_ids=ev.token_ids[i * P : (i + 1) * P], block_size=P
            )
            for i, h in enumerate(ev.block_hashes)
        ],
        tier=_tier(ev.medium),
        group_idx=ev.group_idx,
        kv_cache_spec_kind=ev.kind,
    )
    if ev.parent_block_hash is not None:
        out.parent_block_hash = signed64(ev.parent_block_hash)
    if ev.medium is not None:
        out.medium = ev.medium
    if ev.window is not None:
        out.kv_cache_spec_sliding_window = ev.window
    return out


def _removed(ev: BlockRemoved) -> pb.KvBlocksRemoved:
    out = pb.KvBlocksRemoved(
        block_hashes=[signed64(h) for h in ev.block_hashes],
        tier=_tier(ev.medium),
        group_idx=ev.group_idx,
    )
    if ev.medium is not None:
        out.medium = ev.medium
    return out


def to_proto_events(events: Iterable[KVEvent], first_id: int = 0) -> list[pb.KvCacheEvent]:
    """radixray's events as the gateway's, ``event_id`` counting from ``first_id``."""
    out = []
    for n, ev in enumerate(events, first_id):
        if isinstance(ev, BlockStored):
            out.append(pb.KvCacheEvent(event_id=n, stored=_stored(ev)))
        elif isinstance(ev, BlockRemoved):
            out.append(pb.KvCacheEvent(event_id=n, removed=_removed(ev)))
        elif isinstance(ev, AllBlocksCleared):
            out.append(pb.KvCacheEvent(event_id=n, cleared=pb.KvCacheCleared()))
        else:
            raise TypeError(f"not a KV event: {ev!r}")
    return out


class _Mirror:
    """The live blocks as the events left them: ``(medium, group, hash) -> (depth, stored)``
    with ``stored`` a one-block ``BlockStored`` (its parent, tokens and group)."""

    def __init__(self) -> None:
        self.blocks: dict[tuple, tuple[int, BlockStored]] = {}
        self._depth: dict[int, int] = {}  # hash -> chain depth (any tier or group)

    def apply(self, events: Iterable[KVEvent]) -> None:
        for ev in events:
            if isinstance(ev, AllBlocksCleared):
                self.blocks.clear()
                self._depth.clear()
            elif isinstance(ev, BlockRemoved):
                for h in ev.block_hashes:
                    self.blocks.pop((ev.medium, ev.group_idx, h), None)
            elif isinstance(ev, BlockStored):
                self._store(ev)

    def _store(self, ev: BlockStored) -> None:
        P, parent = ev.block_size, ev.parent_block_hash
        depth = 0 if parent is None else self._depth.get(parent, 0)
        for i, h in enumerate(ev.block_hashes):
            depth += 1
            one = BlockStored(
                [h], parent, ev.token_ids[i * P : (i + 1) * P], P, ev.medium,
                ev.group_idx, ev.kind, ev.window,
            )  # fmt: skip
            self.blocks[(ev.medium, ev.group_idx, h)] = (depth, one)
            self._depth[h] = depth
            parent = h
        if len(self._depth) > 4 * len(self.blocks) + 1024:  # forget the depths of gone blocks
            live = {k[2] for k in self.blocks}
            self._depth = {h: d for h, d in self._depth.items() if h in live}

    def stored_events(self) -> list[BlockStored]:
        """One event per live block, parents before children."""
        return [ev for _, ev in sorted(self.blocks.values(), key=lambda x: x[0])]


class KvEventRelay:
    """The pump, the log and the mirror (see the module's docstring). Everything runs on the
    gRPC server's event loop; ``host.poll`` reads the engine from a thread."""

    def __init__(
        self,
        host,
        poll_interval_s: float = POLL_INTERVAL_S,
        log_batches: int = LOG_BATCHES,
        chunk_blocks: int = SNAPSHOT_CHUNK_BLOCKS,
    ):
        self.host = host
        self.poll_interval_s = poll_interval_s
        self.chunk_blocks = chunk_blocks
        # The last batch's sequence number; before any, the base: the start's wall clock in ms.
        self.seq = time.time_ns() // 1_000_000
        self._log: deque[pb.KvEventBatch] = deque(maxlen=log_batches)
        self._mirror = _Mirror()
        self._grew = asyncio.Event()  # replaced by a fresh one each time a batch is logged
        self._kick = asyncio.Event()
        self._since, self._epoch = -1, None  # the relay's cursor on the host
        self._event_ids = 0
        self._task: asyncio.Task | None = None

    # ------------------------------------------------------------------ the pump

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._pump())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def kick(self) -> None:
        """Poll now (a request's prefill or its end stored pages), not at the next tick."""
        self._kick.set()

    async def _pump(self) -> None:
        while True:
            try:
                await self.poll_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # the engine stopped, say: keep trying, the health check tells
                await asyncio.sleep(1.0)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._kick.wait(), self.poll_interval_s)
            self._kick.clear()

    async def poll_once(self) -> bool:
        """One poll of the host; whether it brought events (then they are the next batch)."""
        r = await self.host.poll(PollRequest(self._since, self._epoch))
        events = decode_events(r.events).events
        self._since, self._epoch = r.seq, r.epoch
        if events:
            self._append(events)
        return bool(events)

    def _append(self, events: list[KVEvent]) -> None:
        self._mirror.apply(events)
        self.seq += 1
        batch = pb.KvEventBatch(
            sequence_number=self.seq,
            timestamp=time.time(),
            events=to_proto_events(events, self._event_ids),
        )
        self._event_ids += len(events)
        self._log.append(batch)
        grew, self._grew = self._grew, asyncio.Event()
        grew.set()

    # ------------------------------------------------------------------ subscribers

    def after(self, pos: int | None) -> list[pb.KvEventBatch] | None:
        """The logged batches after sequence ``pos``; None when they cannot be replayed (no
        cursor, one the log no longer reaches, or one this relay never numbered)."""
        if pos is None or pos > self.seq:
            return None
        if pos == self.seq:
            return []
        log = self._log
        if not log or log[0].sequence_number > pos + 1:
            return None
        skip = pos + 1 - log[0].sequence_number
        return [b for i, b in enumerate(log) if i >= skip]

    def snapshot(self) -> list[pb.KvEventBatch]:
        """The live blocks as snapshot chunks stamped up to the current sequence."""
        stored = self._mirror.stored_events()
        K = self.chunk_blocks
        parts: list[list[KVEvent]] = [stored[i : i + K] for i in range(0, len(stored), K)] or [[]]
        parts[0] = [AllBlocksCleared(), *parts[0]]
        n, now = len(parts), time.time()
        return [
            pb.KvEventBatch(
                sequence_number=self.seq - (n - 1 - i),
                timestamp=now,
                events=to_proto_events(part),
                snapshot=pb.KvSnapshotChunk(index=i, count=n, blocks=len(stored)),
            )
            for i, part in enumerate(parts)
        ]

    async def subscribe(self, start: int) -> AsyncIterator[pb.KvEventBatch]:
        """The stream for a subscriber whose last applied sequence is ``start`` (0: none)."""
        pos = start or None
        while True:
            grew = self._grew  # before reading: a batch logged after this read sets it
            batches = self.after(pos)
            if batches is None:
                batches = self.snapshot()
            for b in batches:
                yield b
            if batches:
                pos = batches[-1].sequence_number
            else:
                await grew.wait()
