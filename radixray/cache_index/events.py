"""KV cache events and their msgpack wire format.

Field names follow vLLM's KV events (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``) so a
router that indexes radixray workers can index vLLM or SGLang engines the same way.

Wire format (version 3), one msgpack array per batch::

    [3, worker_id, seq, ts, [event, ...]]
    event = ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, medium,
             group_idx, kind, window]
          | ["BlockRemoved", block_hashes, medium, group_idx, kind, window]
          | ["AllBlocksCleared"]

The group fields are vLLM's (a hybrid model's KV cache groups): ``group_idx`` numbers the
groups, ``kind`` is "full_attention", "sliding_window" or "mamba", ``window`` the window in
tokens (None but for a sliding window). A model with sliding-window layers whose window pages
are kept apart (docs/window_cache.md) stores each block in both groups and can remove it from
the window group alone. A model with recurrent-state layers (docs/state_cache.md) stores in
the "mamba" group the blocks whose end holds a state checkpoint (a match resumes only there)
and removes a block from it when its checkpoint goes. Version 3 added the "mamba" kind;
versions 2 and 1 (no group fields: the full-attention group) are still read.

Decoding never executes anything from the network (no pickle) and rejects anything that is not
exactly this shape with a ValueError: a half-decoded batch is never returned.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

__all__ = [
    "BlockStored",
    "BlockRemoved",
    "AllBlocksCleared",
    "KVEvent",
    "EventBatch",
    "encode_events",
    "decode_events",
    "WIRE_VERSION",
    "MAX_BATCH_BYTES",
    "FULL_ATTENTION",
    "SLIDING_WINDOW",
    "MAMBA",
]

WIRE_VERSION = 3
_READ_VERSIONS = (1, 2, 3)
FULL_ATTENTION = "full_attention"
SLIDING_WINDOW = "sliding_window"
MAMBA = "mamba"  # vLLM's spelling of a state-layer group
_KINDS = (FULL_ATTENTION, SLIDING_WINDOW, MAMBA)
# A batch larger than this is refused before msgpack looks at it. 64 MiB holds ~8M block hashes,
# far more than one poll interval produces.
MAX_BATCH_BYTES = 64 << 20
_MAX_U64 = (1 << 64) - 1


@dataclass(frozen=True)
class BlockStored:
    """Pages entered the cache. ``block_hashes`` are chained from the root (``hash_blocks`` of
    the whole prefix), ``parent_block_hash`` is the hash of the page before the first (None at
    the root), ``token_ids`` are the stored pages' tokens."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    medium: str | None = "GPU"
    group_idx: int = 0
    kind: str = FULL_ATTENTION
    window: int | None = None


@dataclass(frozen=True)
class BlockRemoved:
    """Pages left the cache (eviction; in the window group, their window pages were dropped)."""

    block_hashes: list[int]
    medium: str | None = "GPU"
    group_idx: int = 0
    kind: str = FULL_ATTENTION
    window: int | None = None


@dataclass(frozen=True)
class AllBlocksCleared:
    """The cache was emptied (reset)."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True)
class EventBatch:
    """Events from one worker, in order. ``seq`` numbers batches per worker so a receiver can
    detect a gap (and ask for a snapshot); ``ts`` is the sender's wall-clock time in seconds."""

    worker_id: str
    seq: int
    ts: float
    events: list[KVEvent] = field(default_factory=list)


def _event_to_wire(ev: KVEvent) -> list[Any]:
    if isinstance(ev, BlockStored):
        return [
            "BlockStored",
            list(ev.block_hashes),
            ev.parent_block_hash,
            list(ev.token_ids),
            ev.block_size,
            ev.medium,
            ev.group_idx,
            ev.kind,
            ev.window,
        ]
    if isinstance(ev, BlockRemoved):
        return ["BlockRemoved", list(ev.block_hashes), ev.medium, ev.group_idx, ev.kind, ev.window]
    if isinstance(ev, AllBlocksCleared):
        return ["AllBlocksCleared"]
    raise TypeError(f"not a KV event: {ev!r}")


def encode_events(batch: EventBatch) -> bytes:
    """Serialize a batch to msgpack bytes."""
    if not isinstance(batch, EventBatch):
        raise TypeError(f"encode_events expects an EventBatch, got {type(batch).__name__}")
    events = [_event_to_wire(e) for e in batch.events]
    return msgpack.packb(
        [WIRE_VERSION, batch.worker_id, batch.seq, batch.ts, events], use_bin_type=True
    )


def _expect(cond: bool, what: str) -> None:
    if not cond:
        raise ValueError(f"invalid KV event batch: {what}")


def _hashes(x: Any, what: str) -> list[int]:
    _expect(isinstance(x, list), f"{what} must be a list of uint64")
    for h in x:
        _expect(type(h) is int and 0 <= h <= _MAX_U64, f"{what} must hold uint64 values")
    return x


def _medium(x: Any) -> str | None:
    _expect(x is None or isinstance(x, str), "medium must be a string or null")
    return x


def _group(x: list[Any], version: int) -> tuple[int, str, int | None]:
    """``(group_idx, kind, window)`` from a v2/v3 event's last three fields."""
    group_idx, kind, window = x
    _expect(type(group_idx) is int and group_idx >= 0, "group_idx must be an int >= 0")
    kinds = _KINDS if version >= 3 else _KINDS[:2]
    _expect(kind in kinds, f"kind must be one of {kinds}")
    if kind == SLIDING_WINDOW:
        _expect(type(window) is int and window >= 1, "a sliding_window group needs window >= 1")
    else:
        _expect(window is None, f"a {kind} group has no window")
    return group_idx, kind, window


def _event_from_wire(w: Any, version: int) -> KVEvent:
    _expect(isinstance(w, list) and w and isinstance(w[0], str), "an event must be [tag, ...]")
    tag = w[0]
    extra = 3 if version >= 2 else 0
    if tag == "BlockStored":
        _expect(len(w) == 6 + extra, f"BlockStored must have {6 + extra} fields")
        _, hashes, parent, tokens, block_size, medium = w[:6]
        _expect(
            parent is None or (type(parent) is int and 0 <= parent <= _MAX_U64),
            "parent_block_hash must be uint64 or null",
        )
        _expect(
            isinstance(tokens, list) and all(type(t) is int for t in tokens),
            "token_ids must be a list of ints",
        )
        _expect(type(block_size) is int and block_size >= 1, "block_size must be an int >= 1")
        group = _group(w[6:], version) if extra else ()
        return BlockStored(
            _hashes(hashes, "block_hashes"), parent, tokens, block_size, _medium(medium), *group
        )
    if tag == "BlockRemoved":
        _expect(len(w) == 3 + extra, f"BlockRemoved must have {3 + extra} fields")
        group = _group(w[3:], version) if extra else ()
        return BlockRemoved(_hashes(w[1], "block_hashes"), _medium(w[2]), *group)
    if tag == "AllBlocksCleared":
        _expect(len(w) == 1, "AllBlocksCleared has no fields")
        return AllBlocksCleared()
    raise ValueError(f"invalid KV event batch: unknown event tag {tag!r}")


def decode_events(data: bytes, max_bytes: int = MAX_BATCH_BYTES) -> EventBatch:
    """Parse bytes from ``encode_events``. Raises ValueError on anything else (never a partial
    batch)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ValueError(f"invalid KV event batch: expected bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise ValueError(f"invalid KV event batch: {len(data)} bytes exceeds the {max_bytes} limit")
    try:
        # unpackb bounds every string/array/map length by len(data) itself; it takes no
        # max_buffer_size (that is Unpacker's), and passing one made every decode fail.
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises several unrelated types on garbage
        raise ValueError(f"invalid KV event batch: not msgpack ({type(e).__name__}: {e})") from None
    _expect(isinstance(obj, list) and len(obj) == 5, "expected [version, worker, seq, ts, events]")
    version, worker_id, seq, ts, events = obj
    # type() first: True == 1.0 == 1 in Python, but a bool or float version is not ours.
    _expect(
        type(version) is int and version in _READ_VERSIONS,
        f"unsupported wire version {version!r} (want one of {_READ_VERSIONS})",
    )
    _expect(
        isinstance(worker_id, (str, int)) and not isinstance(worker_id, bool),
        "worker_id must be a string",
    )
    _expect(type(seq) is int and seq >= 0, "seq must be an int >= 0")
    _expect(isinstance(ts, (int, float)) and not isinstance(ts, bool), "ts must be a number")
    _expect(isinstance(events, list), "events must be a list")
    return EventBatch(worker_id, seq, float(ts), [_event_from_wire(e, version) for e in events])
