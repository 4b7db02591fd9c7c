"""The one codec of the worker protocol: msgpack via msgspec, typed on both ends.

``decode(data, T)`` returns a whole, validated ``T`` or raises :class:`ProtocolError` naming
what was wrong (garbage, a message of another type, a field of the wrong type or out of range,
a message from another protocol version); it never returns half an object.

msgspec over dataclasses + msgpack: measured in benchmarks/bench_protocol.py (a 2,048-token
generate request, a stream chunk, a poll result; encode + decode with the same checks), msgspec
was 2.5-4.7x faster (encode + decode), and its decoder checks every field's type in C.
"""

from __future__ import annotations

import functools
import re
from typing import Any, TypeVar, get_args

import msgspec

from .messages import PROTOCOL_VERSION

__all__ = ["ProtocolError", "encode", "decode", "tags_of"]

T = TypeVar("T")

_encoder = msgspec.msgpack.Encoder()
# Nothing on this hop is near this size; a bigger body is refused before msgpack reads it.
MAX_MESSAGE_BYTES = 64 << 20


class ProtocolError(ValueError):
    """Bytes that are not a valid message of the expected type and version."""


def encode(msg: msgspec.Struct) -> bytes:
    return _encoder.encode(msg)


@functools.cache
def _decoder(kind: Any) -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(kind)


def decode(data: bytes | bytearray | memoryview, kind: type[T]) -> T:
    """``data`` as a ``kind`` (a message struct or a union of them)."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        return _decoder(kind).decode(data)
    except msgspec.ValidationError as e:
        raise ProtocolError(_explain(data, kind, e)) from None
    except msgspec.DecodeError as e:
        raise ProtocolError(f"expected a msgpack {_names(kind)} message: {e}") from None
    except RecursionError:  # garbage nested deeper than msgspec follows
        msg = f"expected a msgpack {_names(kind)} message: nested too deeply"
        raise ProtocolError(msg) from None


def tags_of(kind: Any) -> tuple[str, ...]:
    """The tags a decoder of ``kind`` accepts (``("chunk/1", "error/1")``)."""
    members = get_args(kind) or (kind,)
    return tuple(m.__struct_config__.tag for m in members if m.__struct_config__.tag)


def _names(kind: Any) -> str:
    return " or ".join(t.split("/")[0] for t in tags_of(kind)) or getattr(kind, "__name__", "?")


def _a(noun: str) -> str:
    return ("an " if noun[:1] in "aeiou" else "a ") + noun


def _explain(data, kind: Any, err: msgspec.ValidationError) -> str:
    """Why a message that is valid msgpack is not a valid ``kind``."""
    try:
        raw = msgspec.msgpack.decode(data)
    except (msgspec.DecodeError, RecursionError):
        raw = None
    if isinstance(raw, list) and raw and isinstance(raw[0], str) and "/" in raw[0]:
        name, _, version = raw[0].partition("/")
        expected = {t.split("/")[0] for t in tags_of(kind)}
        if name in expected and version != str(PROTOCOL_VERSION):
            return (
                f"{name} message of protocol version {version}; this side speaks version "
                f"{PROTOCOL_VERSION} (upgrade the router and workers together)"
            )
        if name not in expected:
            return f"expected {_a(_names(kind))} message, got {raw[0]!r}"
        kind = next(m for m in (get_args(kind) or (kind,)) if _tag(m) == raw[0])
    return f"invalid {_names(kind)} message: {err}{_field_names(kind, str(err))}"


def _tag(struct: Any) -> str | None:
    return struct.__struct_config__.tag


# The path msgspec puts at the end of a ValidationError: ``- at `$[3][5][0]``` (a dict value's
# position is ``[...]``). Only the end counts: a value quoted earlier may look like a path.
_PATH = re.compile(r"`\$((?:\[(?:\d+|\.\.\.)\])+)`$")


def _field_names(kind: Any, message: str) -> str:
    """`` (params.stop[0])`` for a msgspec error at ``$[3][5][0]`` of a GenerateRequest:
    structs travel as arrays, so the path alone gives positions, not names."""
    m = _PATH.search(message)
    if m is None or not hasattr(kind, "__struct_fields__"):
        return ""
    names: list[str] = []
    t: Any = kind
    for i, step in enumerate(re.findall(r"\[([^\]]+)\]", m.group(1))):
        fields = getattr(t, "__struct_fields__", None)
        if fields is None or not step.isdigit():
            names.append(f"[{step}]")
            continue
        pos = int(step) - (1 if _tag(t) and i == 0 else 0)  # a tagged struct's first element
        if not 0 <= pos < len(fields):
            return ""
        names.append(("." if names else "") + fields[pos])
        t = msgspec.structs.fields(t)[pos].type
        t = next((a for a in get_args(t) if hasattr(a, "__struct_fields__")), t)
    return f" ({''.join(names)})" if names else ""
