import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixray.cache_index import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    decode_events,
    encode_events,
)
from radixray.cache_index.events import MAX_BATCH_BYTES, WIRE_VERSION

from .helpers import CACHE_SETTINGS

U64_MAX = (1 << 64) - 1


def _batch() -> EventBatch:
    return EventBatch(
        "worker-0",
        7,
        1712345678.25,
        [
            BlockStored([1, U64_MAX, 0], None, list(range(12)), 4, "GPU"),
            BlockStored([42], U64_MAX, [7, 7, 7, 7], 4, None),
            BlockRemoved([1, U64_MAX], "GPU"),
            BlockRemoved([], None),
            AllBlocksCleared(),
        ],
    )


def test_round_trip_is_exact():
    b = _batch()
    out = decode_events(encode_events(b))
    assert out == b
    assert all(type(x) is type(y) for x, y in zip(out.events, b.events, strict=True))
    empty = EventBatch("w", 0, 0.0, [])
    assert decode_events(encode_events(empty)) == empty
    assert (
        decode_events(bytearray(encode_events(b))) == b
        and decode_events(memoryview(encode_events(b))) == b
    )


events_st = st.one_of(
    st.builds(
        BlockStored,
        st.lists(st.integers(0, U64_MAX), max_size=5),
        st.none() | st.integers(0, U64_MAX),
        st.lists(st.integers(-(2**31), 2**31 - 1), max_size=20),
        st.sampled_from([1, 4, 16]),
        st.none() | st.sampled_from(["GPU", "CPU"]),
    ),
    st.builds(
        BlockRemoved,
        st.lists(st.integers(0, U64_MAX), max_size=5),
        st.none() | st.just("GPU"),
    ),
    st.builds(
        BlockRemoved,
        st.lists(st.integers(0, U64_MAX), max_size=5),
        st.just("GPU"),
        st.integers(0, 3),
        st.just("sliding_window"),
        st.integers(1, 1 << 20),
    ),
    st.just(AllBlocksCleared()),
)


@CACHE_SETTINGS
@given(
    st.text(max_size=10),
    st.integers(0, 2**63),
    st.floats(allow_nan=False),
    st.lists(events_st, max_size=6),
)
def test_round_trip_property(worker, seq, ts, events):
    b = EventBatch(worker, seq, ts, events)
    assert decode_events(encode_events(b)) == b


def test_window_group_round_trips_and_version_1_still_reads():
    stored = BlockStored([5, 6], None, list(range(8)), 4, "GPU", 1, "sliding_window", 512)
    removed = BlockRemoved([6], "GPU", 1, "sliding_window", 512)
    b = EventBatch("w", 1, 0.0, [stored, removed])
    assert decode_events(encode_events(b)) == b
    # a version-1 batch (no group fields) reads as the full-attention group
    v1 = msgpack.packb(
        [1, "w", 0, 0.0, [GOOD_STORED[:6], ["BlockRemoved", [1], "GPU"]]], use_bin_type=True
    )
    out = decode_events(v1).events
    assert out == [BlockStored([1, 2], None, list(range(8)), 4, "GPU"), BlockRemoved([1], "GPU")]
    assert out[0].kind == "full_attention" and out[0].window is None and out[0].group_idx == 0


def test_mamba_group_round_trips_and_version_2_still_reads():
    stored = BlockStored([6], 5, [4, 5, 6, 7], 4, "GPU", 1, "mamba")
    removed = BlockRemoved([6], "GPU", 1, "mamba")
    b = EventBatch("w", 1, 0.0, [stored, removed])
    assert decode_events(encode_events(b)) == b
    v2 = msgpack.packb([2, "w", 0, 0.0, [GOOD_STORED]], use_bin_type=True)
    assert decode_events(v2).events[0].kind == "full_attention"


def test_every_truncation_raises_value_error():
    data = encode_events(_batch())
    for n in range(len(data)):
        with pytest.raises(ValueError, match="invalid KV event batch"):
            decode_events(data[:n])


def test_trailing_bytes_raise():
    with pytest.raises(ValueError, match="invalid KV event batch"):
        decode_events(encode_events(_batch()) + b"\x00")


def _raw(version=WIRE_VERSION, worker="w", seq=0, ts=0.0, events=None):
    events = [["AllBlocksCleared"]] if events is None else events
    return msgpack.packb([version, worker, seq, ts, events], use_bin_type=True)


@pytest.mark.parametrize("version", [0, 4, -1, "1", None, 1.5, [1]])
def test_wrong_version(version):
    with pytest.raises(ValueError, match="version"):
        decode_events(_raw(version=version))


@pytest.mark.parametrize("version", [True, 1.0])
def test_version_must_be_the_int_one(version):
    # msgpack keeps bools and floats apart from ints; True == 1 == 1.0 in Python must not pass.
    with pytest.raises(ValueError, match="version"):
        decode_events(_raw(version=version))


G = [0, "full_attention", None]  # the group fields of wire version 2
GOOD_STORED = ["BlockStored", [1, 2], None, [0, 1, 2, 3, 4, 5, 6, 7], 4, "GPU", *G]
STORED_FIELDS = ["tag", "hashes", "parent", "tokens", "bs", "medium", "group", "kind", "window"]


def _stored(**changes):
    fields = dict(zip(STORED_FIELDS, GOOD_STORED, strict=True))
    fields.update(changes)
    return list(fields.values())


@pytest.mark.parametrize(
    "raw",
    [
        msgpack.packb({"version": 1}),  # a map, not an array
        msgpack.packb([1, "w", 0, 0.0]),  # four fields
        msgpack.packb([1, "w", 0, 0.0, [], "extra"]),
        _raw(worker=None),
        _raw(worker=[1]),
        _raw(worker=True),
        _raw(seq=-1),
        _raw(seq=1.0),
        _raw(seq="0"),
        _raw(ts="now"),
        _raw(ts=None),
        _raw(ts=False),
        _raw(events={"a": 1}),
        _raw(events="AllBlocksCleared"),
        _raw(events=[[]]),
        _raw(events=[[1]]),
        _raw(events=["AllBlocksCleared"]),
        _raw(events=[["Nope"]]),
        _raw(events=[["AllBlocksCleared", 1]]),
        _raw(events=[["BlockRemoved", [1]]]),
        _raw(events=[["BlockRemoved", [1], "GPU", 3]]),
        _raw(events=[["BlockRemoved", [-1], "GPU", *G]]),
        _raw(events=[["BlockRemoved", ["1"], "GPU", *G]]),
        _raw(events=[["BlockRemoved", [1.0], "GPU", *G]]),
        _raw(events=[["BlockRemoved", [True], "GPU", *G]]),
        _raw(events=[["BlockRemoved", 1, "GPU", *G]]),
        _raw(events=[["BlockRemoved", [1], 5, *G]]),
        _raw(events=[_stored(hashes=[1, -2])]),
        _raw(events=[_stored(hashes=None)]),
        _raw(events=[_stored(parent=-1)]),
        _raw(events=[_stored(parent="0")]),
        _raw(events=[_stored(parent=True)]),
        _raw(events=[_stored(tokens=[1.5])]),
        _raw(events=[_stored(tokens="abc")]),
        _raw(events=[_stored(tokens=[None])]),
        _raw(events=[_stored(bs=0)]),
        _raw(events=[_stored(bs=True)]),
        _raw(events=[_stored(bs="4")]),
        _raw(events=[_stored(medium=1)]),
        _raw(events=[GOOD_STORED[:5]]),
        _raw(events=[GOOD_STORED[:6]]),  # version 2 without the group fields
        _raw(events=[_stored(group=-1)]),
        _raw(events=[_stored(group="0")]),
        _raw(events=[_stored(kind="state")]),
        _raw(events=[_stored(kind="mamba", window=4)]),  # a mamba group has no window
        _raw(version=2, events=[_stored(kind="mamba")]),  # version 2 knew no mamba group
        _raw(events=[_stored(window=512)]),  # a full-attention group has no window
        _raw(events=[_stored(kind="sliding_window")]),  # a window group needs one
        _raw(events=[_stored(kind="sliding_window", window=0)]),
        _raw(events=[_stored(kind="sliding_window", window=True)]),
        _raw(events=[["BlockRemoved", [1], "GPU", 1, "sliding_window", None]]),
        # One good event then a bad one: no half batch comes back.
        _raw(events=[GOOD_STORED, ["BlockRemoved", [-5], None, *G]]),
        b"",
        b"\xc1",  # a byte msgpack never uses
        b"\x92\x01",  # an array header promising more than there is
    ],
)
def test_wrong_shapes_and_types_raise_value_error(raw):
    with pytest.raises(ValueError, match="invalid KV event batch"):
        decode_events(raw)


@pytest.mark.parametrize("thing", ["a string", None, 12, [1, 2]])
def test_non_bytes_raise_value_error(thing):
    with pytest.raises(ValueError, match="expected bytes"):
        decode_events(thing)


def test_oversized_input_is_refused_before_parsing():
    data = encode_events(_batch())
    with pytest.raises(ValueError, match="exceeds"):
        decode_events(data, max_bytes=len(data) - 1)
    assert decode_events(data, max_bytes=len(data)) == _batch()
    with pytest.raises(ValueError, match="exceeds"):
        decode_events(b"\x00" * (MAX_BATCH_BYTES + 1))


def test_encode_rejects_non_batches():
    with pytest.raises(TypeError, match="EventBatch"):
        encode_events([1, 2])
    with pytest.raises(TypeError, match="not a KV event"):
        encode_events(EventBatch("w", 0, 0.0, ["BlockStored"]))


@CACHE_SETTINGS
@given(st.binary(max_size=200))
def test_random_bytes_raise_value_error_or_decode_cleanly(data):
    try:
        out = decode_events(data)
    except ValueError as e:
        assert "invalid KV event batch" in str(e)
    else:  # astronomically unlikely, but then it must be a whole, valid batch
        assert isinstance(out, EventBatch) and decode_events(encode_events(out)) == out


@CACHE_SETTINGS
@given(st.data())
def test_mutated_valid_batches_never_raise_anything_but_value_error(data):
    raw = bytearray(encode_events(_batch()))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    try:
        out = decode_events(bytes(raw))
    except ValueError:
        return
    assert isinstance(out, EventBatch)
    for ev in out.events:
        assert isinstance(ev, (BlockStored, BlockRemoved, AllBlocksCleared))
