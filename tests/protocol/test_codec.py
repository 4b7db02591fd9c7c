"""The worker protocol's messages and codec: every message round-trips exactly, and anything that
is not a whole, valid message of the expected type and version is a ``ProtocolError`` (a
``ValueError``) naming what was expected, never half an object and never another exception."""

from __future__ import annotations

import math
import sys

import msgspec
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from radixray.cache_index import events as kv_events
from radixray.cache_index.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from radixray.protocol import (
    FINISH_REASONS,
    MISS_CAUSES,
    PROTOCOL_VERSION,
    Aborted,
    AbortRequest,
    Ack,
    Empty,
    EngineFailure,
    ErrorInfo,
    ErrorKind,
    GenerateRequest,
    Health,
    InvalidRequest,
    LoadReport,
    Overloaded,
    PollRequest,
    PollResult,
    ProtocolError,
    RequestError,
    SamplingParams,
    StreamChunk,
    TokenLogprob,
    WorkerCounters,
    WorkerInfo,
    WorkerUnavailable,
    codec,
    decode,
    encode,
    error_for,
    messages,
)

# Each top-level message type and the name in its tag ("<name>/<version>").
TAG_NAMES: dict[type, str] = {
    GenerateRequest: "generate",
    StreamChunk: "chunk",
    ErrorInfo: "error",
    AbortRequest: "abort",
    Ack: "ack",
    Empty: "empty",
    PollRequest: "poll",
    PollResult: "poll_result",
    WorkerInfo: "info",
    Health: "health",
}
MESSAGE_TYPES = list(TAG_NAMES)
# The name with its article, as "expected <article> <name> message" spells it.
A_NAME: dict[type, str] = {
    GenerateRequest: "a generate",
    StreamChunk: "a chunk",
    ErrorInfo: "an error",
    AbortRequest: "an abort",
    Ack: "an ack",
    Empty: "an empty",
    PollRequest: "a poll",
    PollResult: "a poll_result",
    WorkerInfo: "an info",
    Health: "a health",
}
ERROR_CLASSES = (InvalidRequest, EngineFailure, WorkerUnavailable, Overloaded, Aborted)
H = settings(deadline=None)  # hypothesis: no timing assertions

KV_BATCH = EventBatch(
    "worker-0",
    7,
    1712345678.25,
    [
        AllBlocksCleared(),
        BlockStored([11, 12], None, [1, 2, 3, 4, 5, 6, 7, 8], 4),
        BlockStored([13], 12, [9, 10, 11, 12], 4, medium=None),
        BlockRemoved([11, 12, 13]),
    ],
)


def _samples() -> list[tuple[str, msgspec.Struct]]:
    """One or more messages of every type, with optional fields both set and left out."""
    load = LoadReport(
        running=3,
        waiting=2,
        queued_prefill_tokens=4096,
        active_decode_tokens=1500,
        free_pages=100,
        total_pages=512,
        cached_pages=300,
        evictable_pages=250,
        prefill_tokens_per_s=12345.5,
        prefill_overhead_s=0.0125,
        prefill_fit_moments=(1.0, 2.5, 3.25, -4.0, 1e-9),
        decode_step_s=0.021,
        decode_tokens_per_s=900.0,
        hit_rate=0.625,
        preemptions=1,
        evicted_pages=17,
    )
    counters = WorkerCounters(
        requests_finished=10,
        requests_aborted=1,
        prompt_tokens=5000,
        completion_tokens=700,
        cached_tokens=3000,
        miss_tokens={"cold": 1500, "page_tail": 400, "evicted": 100},
        steps=123,
        prefill_tokens=2000,
        decode_tokens=700,
    )
    params = SamplingParams(
        max_tokens=64,
        temperature=0.7,
        top_p=0.9,
        top_k=40,
        seed=-(2**63),
        stop=("\n\n", "</s>"),
        stop_token_ids=(2, 32000),
        ignore_eos=True,
        min_p=0.05,
        presence_penalty=-1.5,
        frequency_penalty=2.0,
        repetition_penalty=1.1,
        logit_bias={7: -100.0, 3: 0.5},
        min_tokens=4,
        logprobs=20,
        prompt_logprobs=0,
    )
    samples: list[tuple[str, msgspec.Struct]] = [
        ("generate", GenerateRequest("req-1", [1, 2, 3, 2**31 - 1], params, extra_key="tenant-a")),
        ("generate-defaults", GenerateRequest("r", [0], SamplingParams())),
        ("chunk", StreamChunk([5, 6], "hi", cached_tokens=16)),
        ("chunk-empty", StreamChunk([], "")),
        (
            "chunk-final",
            StreamChunk(
                [7],
                " wörld ✓",
                cached_tokens=16,
                finish_reason="stop",
                prompt_tokens=20,
                completion_tokens=3,
                miss={"cached": 16, "page_tail": 4},
            ),
        ),
        (
            "chunk-logprobs",
            StreamChunk(
                [7],
                "a",
                logprobs=[TokenLogprob(-0.25, [7, 3], [-0.25, -1.5])],
                prompt_logprobs=[
                    None,
                    TokenLogprob(-3.0),
                    TokenLogprob(-float("inf"), [1], [-0.1]),
                ],
            ),
        ),
        ("abort", AbortRequest("req-1")),
        ("ack", Ack()),
        ("empty", Empty()),
        ("poll", PollRequest(41, "epoch-abc")),
        ("poll-defaults", PollRequest()),
        (
            "poll_result",
            PollResult(
                "worker-0",
                "epoch-abc",
                7,
                True,
                kv_events.encode_events(KV_BATCH),
                True,
                load,
                counters,
            ),
        ),
        (
            "poll_result-defaults",
            PollResult("w", "e", 0, False, b"", False, LoadReport(), WorkerCounters()),
        ),
        (
            "info",
            WorkerInfo(
                worker_id="worker-0",
                epoch="epoch-abc",
                model="qwen2.5-0.5b-instruct-q8_0.gguf",
                page_size=16,
                max_model_len=4096,
                vocab_size=151936,
                cache="radix",
                num_pages=512,
                device="cuda:0",
                perf_class="NVIDIA H200/bf16",
                address="10.0.0.5:8001",
                pid=4242,
                node_ip="10.0.0.5",
                node_id="node-1",
            ),
        ),
        ("info-defaults", WorkerInfo("w", "e", "m", 16, 2048, 32000, "chunk", 8, "cpu", "cpu")),
        ("health", Health(True, "worker-0", 12.5)),
        ("health-detail", Health(False, "worker-0", 0.0, "engine stopped: CUDA error")),
    ]
    for kind in ErrorKind:
        samples.append((f"error-{kind.value}", ErrorInfo(kind, f"{kind.value} happened", "prompt")))
        samples.append((f"error-{kind.value}-no-param", ErrorInfo(kind, "no param")))
    return samples


SAMPLES = _samples()
SAMPLE_IDS = [name for name, _ in SAMPLES]
SAMPLE_MSGS = [msg for _, msg in SAMPLES]
# One sample per type (the first), for checks that pair types.
ONE_OF_EACH = {t: next(m for m in SAMPLE_MSGS if type(m) is t) for t in MESSAGE_TYPES}


def _raw(msg: msgspec.Struct) -> list:
    """The message as plain msgpack values (a list: tag, then the fields in order)."""
    return msgspec.msgpack.decode(encode(msg))


def _pack(raw) -> bytes:
    return msgspec.msgpack.encode(raw)


def _tag(kind: type) -> str:
    return f"{TAG_NAMES[kind]}/{PROTOCOL_VERSION}"


# ---------------------------------------------------------------------------- strategies

token_id = st.integers(0, 2**31 - 1)
sampling_params = st.builds(
    SamplingParams,
    max_tokens=st.integers(1, 2**31),
    temperature=st.floats(0.0, 100.0),
    top_p=st.floats(0.0, 1.0, exclude_min=True),
    top_k=st.just(-1) | st.integers(1, 2**31),
    seed=st.none() | st.integers(-(2**63), 2**63 - 1),
    stop=st.lists(st.text(min_size=1, max_size=8), max_size=4).map(tuple),
    stop_token_ids=st.lists(token_id, max_size=4).map(tuple),
    ignore_eos=st.booleans(),
    min_p=st.floats(0.0, 1.0),
    presence_penalty=st.floats(-2.0, 2.0),
    frequency_penalty=st.floats(-2.0, 2.0),
    repetition_penalty=st.floats(0.0, 1e6, exclude_min=True),
    logit_bias=st.dictionaries(token_id, st.floats(-100.0, 100.0), max_size=4),
    min_tokens=st.just(0) | st.integers(0, 1),
)
generate_requests = st.builds(
    GenerateRequest,
    request_id=st.text(min_size=1, max_size=256),
    prompt_ids=st.lists(token_id, min_size=1, max_size=300),
    params=sampling_params,
    extra_key=st.none() | st.text(max_size=256),
)
non_neg = st.integers(0, 2**63 - 1)
stream_chunks = st.builds(
    StreamChunk,
    token_ids=st.lists(token_id, max_size=32),
    text=st.text(max_size=64),
    cached_tokens=non_neg,
    finish_reason=st.none() | st.sampled_from(FINISH_REASONS),
    prompt_tokens=non_neg,
    completion_tokens=non_neg,
    miss=st.none() | st.dictionaries(st.sampled_from(MISS_CAUSES), st.integers(0, 2**31)),
)
error_infos = st.builds(
    ErrorInfo, st.sampled_from(ErrorKind), st.text(max_size=64), st.none() | st.text(max_size=16)
)


# ---------------------------------------------------------------------------- round trips


def test_the_samples_cover_every_message_type():
    """A new message type in messages.py must get a sample here (and a row in TAG_NAMES)."""
    tagged = {
        obj
        for obj in vars(messages).values()
        if isinstance(obj, type)
        and issubclass(obj, msgspec.Struct)
        and obj.__struct_config__.tag is not None
    }
    assert tagged == set(MESSAGE_TYPES)
    assert {type(m) for m in SAMPLE_MSGS} == set(MESSAGE_TYPES)
    assert {m.kind for m in SAMPLE_MSGS if isinstance(m, ErrorInfo)} == set(ErrorKind)
    for kind, name in TAG_NAMES.items():
        assert kind.__struct_config__.tag == f"{name}/{PROTOCOL_VERSION}"
        assert _raw(ONE_OF_EACH[kind])[0] == f"{name}/{PROTOCOL_VERSION}"


@pytest.mark.parametrize("msg", SAMPLE_MSGS, ids=SAMPLE_IDS)
def test_round_trip_every_message(msg):
    data = encode(msg)
    assert isinstance(data, bytes)
    for buf in (data, bytearray(data), memoryview(data)):
        out = decode(buf, type(msg))
        assert type(out) is type(msg)
        assert out == msg
        assert encode(out) == data


@pytest.mark.parametrize("msg", SAMPLE_MSGS, ids=SAMPLE_IDS)
def test_round_trip_through_the_reply_union(msg):
    """The client decodes a reply as ``reply type | ErrorInfo``: both members come back."""
    if isinstance(msg, ErrorInfo):
        kinds = [t | ErrorInfo for t in MESSAGE_TYPES if t is not ErrorInfo]
    else:
        kinds = [type(msg) | ErrorInfo]
    for kind in kinds:
        out = decode(encode(msg), kind)
        assert type(out) is type(msg)
        assert out == msg


def test_poll_result_carries_kv_event_bytes_unchanged():
    msg = next(m for m in SAMPLE_MSGS if isinstance(m, PollResult) and m.events)
    out = decode(encode(msg), PollResult)
    assert out.events == kv_events.encode_events(KV_BATCH)
    assert kv_events.decode_events(out.events) == KV_BATCH
    assert out.load.prefill_fit_moments == (1.0, 2.5, 3.25, -4.0, 1e-9)
    assert out.counters.miss_tokens == {"cold": 1500, "page_tail": 400, "evicted": 100}


@H
@given(generate_requests)
def test_round_trip_generate_request(req):
    out = decode(encode(req), GenerateRequest)
    assert type(out) is GenerateRequest
    assert out == req
    assert out.params == req.params
    assert out.prompt_ids == req.prompt_ids


@H
@given(stream_chunks)
def test_round_trip_stream_chunk(chunk):
    out = decode(encode(chunk), StreamChunk)
    assert type(out) is StreamChunk
    assert out == chunk
    assert decode(encode(chunk), StreamChunk | ErrorInfo) == chunk


@H
@given(error_infos)
def test_round_trip_error_info(info):
    out = decode(encode(info), ErrorInfo)
    assert out == info
    back = out.exception()
    assert (type(back), back.message, back.param) == (
        type(info.exception()),
        info.message,
        info.param,
    )


# ---------------------------------------------------------------------------- garbage


@pytest.mark.parametrize("kind", MESSAGE_TYPES, ids=list(TAG_NAMES.values()))
@H
@given(data=st.binary(max_size=256))
def test_random_bytes_are_refused(kind, data):
    # A valid message holds its tag as a msgpack string: bytes without it are never valid.
    assume(_tag(kind).encode() not in data)
    with pytest.raises(ProtocolError) as info:
        decode(data, kind)
    assert f"{TAG_NAMES[kind]} message" in str(info.value)


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8)
    | st.sampled_from(
        [_tag(t) for t in MESSAGE_TYPES] + ["generate/3", "generate/1", "stop", "cold"]
    ),
    lambda inner: st.lists(inner, max_size=8) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=16,
)


@settings(deadline=None, max_examples=150)
@given(
    kind=st.sampled_from(MESSAGE_TYPES),
    raw=msgpack_values
    | st.tuples(st.sampled_from(MESSAGE_TYPES), st.lists(msgpack_values, max_size=16)).map(
        lambda t: [_tag(t[0]), *t[1]]
    ),
)
def test_well_formed_msgpack_of_the_wrong_shape_is_refused(kind, raw):
    """Valid msgpack (often with a real tag first) that is not a valid message: refused."""
    data = _pack(raw)
    try:
        out = decode(data, kind)
    except ProtocolError as e:
        assert f"{TAG_NAMES[kind]} message" in str(e)
    else:  # the fields happened to fit: then it is a whole, valid message
        assert type(out) is kind
        assert decode(encode(out), kind) == out


@pytest.mark.parametrize("msg", SAMPLE_MSGS, ids=SAMPLE_IDS)
def test_every_truncation_is_refused(msg):
    data = encode(msg)
    name = TAG_NAMES[type(msg)]
    for n in range(len(data)):
        with pytest.raises(ProtocolError) as info:
            decode(data[:n], type(msg))
        assert str(info.value) == f"expected a msgpack {name} message: Input data was truncated"


@pytest.mark.parametrize("msg", SAMPLE_MSGS, ids=SAMPLE_IDS)
def test_trailing_bytes_are_refused(msg):
    name = TAG_NAMES[type(msg)]
    for extra in (b"\x00", b"\xc0", encode(msg)):
        with pytest.raises(ProtocolError, match=f"^expected a msgpack {name} message: "):
            decode(encode(msg) + extra, type(msg))


@pytest.mark.parametrize("kind", MESSAGE_TYPES, ids=list(TAG_NAMES.values()))
def test_a_message_of_another_type_is_refused(kind):
    for other, msg in ONE_OF_EACH.items():
        if other is kind:
            continue
        with pytest.raises(ProtocolError) as info:
            decode(encode(msg), kind)
        assert str(info.value) == f"expected {A_NAME[kind]} message, got '{_tag(other)}'"


def test_a_message_outside_a_union_names_every_member():
    with pytest.raises(ProtocolError) as info:
        decode(encode(Ack()), StreamChunk | ErrorInfo)
    assert str(info.value) == f"expected a chunk or error message, got 'ack/{PROTOCOL_VERSION}'"
    with pytest.raises(ProtocolError) as info:  # the article follows the first name
        decode(encode(Ack()), ErrorInfo | StreamChunk)
    assert str(info.value) == f"expected an error or chunk message, got 'ack/{PROTOCOL_VERSION}'"
    with pytest.raises(ProtocolError) as info:
        decode(b"\xc1", PollResult | ErrorInfo)
    assert str(info.value).startswith("expected a msgpack poll_result or error message: ")


def test_examples_of_garbage_messages():
    cases = [
        (b"", StreamChunk, "expected a msgpack chunk message: Input data was truncated"),
        (
            b"\xc1",
            StreamChunk,
            "expected a msgpack chunk message: MessagePack data is malformed: "
            "invalid opcode '\\xc1' (byte 0)",
        ),
        (_pack(5), StreamChunk, "invalid chunk message: Expected `array`, got `int`"),
        (
            _pack({"token_ids": [1]}),
            StreamChunk,
            "invalid chunk message: Expected `array`, got `object`",
        ),
        (
            _pack(["chunk", [1], "a"]),
            StreamChunk,
            "invalid chunk message: Invalid value 'chunk' - at `$[0]`",
        ),
        (_pack(["hello/1", 1]), StreamChunk, "expected a chunk message, got 'hello/1'"),
        (
            _pack([f"generate/{PROTOCOL_VERSION}", "r"]),
            GenerateRequest,
            "invalid generate message: Expected `array` of at least length 4, got 2",
        ),
    ]
    for data, kind, message in cases:
        with pytest.raises(ProtocolError) as info:
            decode(data, kind)
        assert str(info.value) == message
        assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("msg", SAMPLE_MSGS, ids=SAMPLE_IDS)
def test_every_field_of_the_wrong_type_is_refused_by_position(msg):
    """No field accepts a msgpack extension value: each position is checked and named."""
    raw = _raw(msg)
    name = TAG_NAMES[type(msg)]
    for i in range(1, len(raw)):
        bad = list(raw)
        bad[i] = msgspec.msgpack.Ext(1, b"x")
        with pytest.raises(ProtocolError) as info:
            decode(_pack(bad), type(msg))
        text = str(info.value)
        field = type(msg).__struct_fields__[i - 1]  # index 0 is the tag
        assert text.startswith(f"invalid {name} message: Expected `")
        assert text.endswith(f", got `ext` - at `$[{i}]` ({field})")


@pytest.mark.parametrize(
    "kind, message",
    [
        (GenerateRequest, "invalid generate message: Expected `array` of at least length 4, got 1"),
        (StreamChunk, "invalid chunk message: Expected `array` of at least length 3, got 1"),
        (ErrorInfo, "invalid error message: Expected `array` of at least length 3, got 1"),
        (AbortRequest, "invalid abort message: Expected `array` of at least length 2, got 1"),
        # The tag position names no field.
        (Ack, "invalid ack message: Expected `str`, got `array` - at `$[0]`"),
        (Empty, "invalid empty message: Expected `str`, got `array` - at `$[0]`"),
        (PollRequest, "invalid poll message: Expected `str`, got `array` - at `$[0]`"),
        (PollResult, "invalid poll_result message: Expected `array` of at least length 9, got 1"),
        (WorkerInfo, "invalid info message: Expected `array` of at least length 11, got 1"),
        (Health, "invalid health message: Expected `array` of at least length 4, got 1"),
        (
            Health | ErrorInfo,
            "invalid health or error message: Expected `str`, got `array` - at `$[0]`",
        ),
    ],
    ids=[*TAG_NAMES.values(), "health|error"],
)
def test_deeply_nested_garbage_is_a_protocol_error(kind, message):
    """msgspec raises RecursionError, not DecodeError, on ~1 KB of nested arrays when it
    decodes without a type (as the codec does to explain a refusal): still a ProtocolError."""
    depth = 2 * sys.getrecursionlimit() + 10
    data = b"\x91" * depth + b"\x01"  # [[[...[1]...]]]
    with pytest.raises(ProtocolError) as info:
        decode(data, kind)
    assert str(info.value) == message


# ---------------------------------------------------------------------------- versions


@pytest.mark.parametrize("kind", MESSAGE_TYPES, ids=list(TAG_NAMES.values()))
@pytest.mark.parametrize(
    "version", sorted({"0", "1", str(PROTOCOL_VERSION - 1), str(PROTOCOL_VERSION + 1), "17"})
)
def test_a_message_of_another_protocol_version_is_refused_by_name(kind, version):
    name = TAG_NAMES[kind]
    raw = _raw(ONE_OF_EACH[kind])
    for fields in (raw[1:], [*raw[1:], "a field from the future"], []):
        with pytest.raises(ProtocolError) as info:
            decode(_pack([f"{name}/{version}", *fields]), kind)
        assert str(info.value) == (
            f"{name} message of protocol version {version}; this side speaks version "
            f"{PROTOCOL_VERSION} (upgrade the router and workers together)"
        )


def test_a_future_generate_request_says_its_protocol_version():
    future = PROTOCOL_VERSION + 1
    raw = _raw(ONE_OF_EACH[GenerateRequest])
    raw[0] = f"generate/{future}"
    with pytest.raises(ProtocolError, match=f"protocol version {future}"):
        decode(_pack(raw), GenerateRequest)
    # The client decodes replies as unions: the version is named there too.
    raw = _raw(ONE_OF_EACH[StreamChunk])
    raw[0] = f"chunk/{future}"
    with pytest.raises(ProtocolError, match=f"^chunk message of protocol version {future}; "):
        decode(_pack(raw), StreamChunk | ErrorInfo)


# ---------------------------------------------------------------------------- field validation


def _generate_raw(**fields) -> list:
    raw = _raw(GenerateRequest("req-1", [1, 2, 3], SamplingParams(), extra_key="k"))
    for i, name in enumerate(GenerateRequest.__struct_fields__, start=1):
        if name in fields:
            raw[i] = fields[name]
    return raw


def test_generate_request_boundaries_are_accepted():
    out = decode(
        _pack(_generate_raw(request_id="é" * 256, prompt_ids=[0, 2**31 - 1], extra_key="k" * 256)),
        GenerateRequest,
    )
    assert out.request_id == "é" * 256
    assert out.prompt_ids == [0, 2**31 - 1]
    assert out.extra_key == "k" * 256


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"prompt_ids": [5, -1]}, "Expected `int` >= 0 - at `$[2][1]` (prompt_ids[1])"),
        (
            {"prompt_ids": [5, 6, 2**31]},
            "Expected `int` <= 2147483647 - at `$[2][2]` (prompt_ids[2])",
        ),
        (
            {"prompt_ids": [2**64 - 1]},
            "Expected `int` <= 2147483647 - at `$[2][0]` (prompt_ids[0])",
        ),
        ({"prompt_ids": []}, "Expected `array` of length >= 1 - at `$[2]` (prompt_ids)"),
        ({"prompt_ids": ["1"]}, "Expected `int`, got `str` - at `$[2][0]` (prompt_ids[0])"),
        ({"prompt_ids": [1.0]}, "Expected `int`, got `float` - at `$[2][0]` (prompt_ids[0])"),
        ({"prompt_ids": [True]}, "Expected `int`, got `bool` - at `$[2][0]` (prompt_ids[0])"),
        ({"prompt_ids": None}, "Expected `array`, got `None` - at `$[2]` (prompt_ids)"),
        ({"request_id": "r" * 257}, "Expected `str` of length <= 256 - at `$[1]` (request_id)"),
        ({"request_id": ""}, "Expected `str` of length >= 1 - at `$[1]` (request_id)"),
        ({"request_id": 7}, "Expected `str`, got `int` - at `$[1]` (request_id)"),
        ({"extra_key": "k" * 257}, "Expected `str` of length <= 256 - at `$[4]` (extra_key)"),
        ({"params": None}, "Expected `array`, got `None` - at `$[3]` (params)"),
    ],
)
def test_generate_request_fields_are_checked_on_decode(fields, message):
    with pytest.raises(ProtocolError) as info:
        decode(_pack(_generate_raw(**fields)), GenerateRequest)
    assert str(info.value) == f"invalid generate message: {message}"


PARAM_INDEX = {name: i for i, name in enumerate(SamplingParams.__struct_fields__)}


def _params_raw(**changes) -> list:
    raw = list(_raw(ONE_OF_EACH[GenerateRequest])[3])
    for name, value in changes.items():
        raw[PARAM_INDEX[name]] = value
    return raw


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_tokens", 0),
        ("max_tokens", -5),
        ("temperature", -1.0),
        ("temperature", 100.5),
        ("temperature", math.nan),
        ("temperature", math.inf),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_p", -0.1),
        ("top_k", 0),
        ("top_k", -2),
        ("seed", 2**63),
        ("stop", [""]),
        ("stop", ["ok", ""]),
        ("stop_token_ids", [1, -1]),
        ("min_p", 1.5),
        ("presence_penalty", -2.5),
        ("frequency_penalty", 2.5),
        ("repetition_penalty", 0.0),
        ("logit_bias", [[1, 101.0]]),
        ("logit_bias", [[1, 1.0], [1, 2.0]]),
        ("min_tokens", 10**6),
    ],
)
def test_sampling_params_ranges_are_checked_on_decode(field, value):
    data = _pack(_generate_raw(params=_params_raw(**{field: value})))
    with pytest.raises(ProtocolError) as info:
        decode(data, GenerateRequest)
    text = str(info.value)
    assert text.startswith(f"invalid generate message: SamplingParams.{field} must be ")
    # SamplingParams.__post_init__ refuses it: msgspec places it at the whole struct.
    assert text.endswith(" - at `$[3]` (params)")
    assert field in text


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("stop", [1], "Expected `str`, got `int` - at `$[3][5][0]` (params.stop[0])"),
        ("stop", "\n", "Expected `array`, got `str` - at `$[3][5]` (params.stop)"),
        ("max_tokens", True, "Expected `int`, got `bool` - at `$[3][0]` (params.max_tokens)"),
        ("max_tokens", 1.5, "Expected `int`, got `float` - at `$[3][0]` (params.max_tokens)"),
        (
            "temperature",
            "hot",
            "Expected `float`, got `str` - at `$[3][1]` (params.temperature)",
        ),
        ("top_k", None, "Expected `int`, got `None` - at `$[3][3]` (params.top_k)"),
        ("seed", 2**64 - 1, None),  # in msgpack's range, out of SamplingParams'
        ("ignore_eos", 1, "Expected `bool`, got `int` - at `$[3][7]` (params.ignore_eos)"),
    ],
)
def test_sampling_params_types_are_checked_on_decode(field, value, message):
    data = _pack(_generate_raw(params=_params_raw(**{field: value})))
    with pytest.raises(ProtocolError) as info:
        decode(data, GenerateRequest)
    if message is None:
        assert f"SamplingParams.{field} must be " in str(info.value)
    else:
        assert str(info.value) == f"invalid generate message: {message}"


def test_a_non_string_stop_names_the_field():
    """msgspec catches it (the structs are array_like, so its path is positions only): the
    codec adds the field's name."""
    data = _pack(_generate_raw(params=_params_raw(stop=[1])))
    with pytest.raises(ProtocolError) as info:
        decode(data, GenerateRequest)
    assert str(info.value) == (
        "invalid generate message: Expected `str`, got `int` - at `$[3][5][0]` (params.stop[0])"
    )


def test_sampling_params_with_too_many_fields_are_refused():
    data = _pack(_generate_raw(params=[*_params_raw(), "extra"]))
    with pytest.raises(ProtocolError) as info:
        decode(data, GenerateRequest)
    n = len(SamplingParams.__struct_fields__)
    assert str(info.value) == (
        f"invalid generate message: Expected `array` of at most length {n}, got {n + 1} - at "
        "`$[3]` (params)"
    )


def test_stream_chunk_counts_are_non_negative_on_decode():
    for i, field in ((3, "cached_tokens"), (5, "prompt_tokens"), (6, "completion_tokens")):
        raw = _raw(StreamChunk([1], "a", 1, "stop", 1, 1))
        raw[i] = -1
        with pytest.raises(ProtocolError) as info:
            decode(_pack(raw), StreamChunk)
        assert str(info.value) == (
            f"invalid chunk message: Expected `int` >= 0 - at `$[{i}]` ({field})"
        )


def test_error_info_kind_must_be_known():
    with pytest.raises(ProtocolError) as info:
        decode(_pack([f"error/{PROTOCOL_VERSION}", "on_fire", "m", None]), ErrorInfo)
    assert str(info.value) == (
        "invalid error message: Invalid enum value 'on_fire' - at `$[1]` (kind)"
    )


# ---------------------------------------------------------------------------- field names


def _with(msg: msgspec.Struct, path: tuple, value) -> bytes:
    """``msg`` encoded with the value at ``path`` (list indices / dict keys) replaced."""
    raw = _raw(msg)
    inner = raw
    for key in path[:-1]:
        inner = inner[key]
    inner[path[-1]] = value
    return _pack(raw)


GENERATE = ONE_OF_EACH[GenerateRequest]
POLL_RESULT = next(m for m in SAMPLE_MSGS if isinstance(m, PollResult) and m.events)


@pytest.mark.parametrize(
    "msg, path, value, kind, message",
    [
        (
            GENERATE,
            (3, 0),
            "16",
            GenerateRequest,
            "invalid generate message: Expected `int`, got `str` - at `$[3][0]` "
            "(params.max_tokens)",
        ),
        (
            GENERATE,
            (3, 5),
            [1],
            GenerateRequest,
            "invalid generate message: Expected `str`, got `int` - at `$[3][5][0]` "
            "(params.stop[0])",
        ),
        (
            GENERATE,
            (3, 5, 1),
            None,
            GenerateRequest,
            "invalid generate message: Expected `str`, got `None` - at `$[3][5][1]` "
            "(params.stop[1])",
        ),
        (
            GENERATE,
            (1,),
            7,
            GenerateRequest,
            "invalid generate message: Expected `str`, got `int` - at `$[1]` (request_id)",
        ),
        (
            POLL_RESULT,
            (7, 2),
            "many",
            PollResult,
            "invalid poll_result message: Expected `int`, got `str` - at `$[7][2]` "
            "(load.queued_prefill_tokens)",
        ),
        (  # the client decodes the reply union: the member is found by its tag
            POLL_RESULT,
            (7, 2),
            "many",
            PollResult | ErrorInfo,
            "invalid poll_result message: Expected `int`, got `str` - at `$[7][2]` "
            "(load.queued_prefill_tokens)",
        ),
        (
            POLL_RESULT,
            (7, 10, 1),
            "x",
            PollResult,
            "invalid poll_result message: Expected `float`, got `str` - at `$[7][10][1]` "
            "(load.prefill_fit_moments[1])",
        ),
        (
            POLL_RESULT,
            (8, 5),
            [1500],
            PollResult,
            "invalid poll_result message: Expected `object`, got `array` - at `$[8][5]` "
            "(counters.miss_tokens)",
        ),
        (
            POLL_RESULT,
            (8, 5),
            {1: 1500},
            PollResult,
            "invalid poll_result message: Expected `str`, got `int` - at `key` in `$[8][5]` "
            "(counters.miss_tokens)",
        ),
        (
            POLL_RESULT,
            (1,),
            None,
            PollResult,
            "invalid poll_result message: Expected `str`, got `None` - at `$[1]` (worker_id)",
        ),
        (  # index 0 of a tagged message is its tag, not a field
            ONE_OF_EACH[StreamChunk],
            (0,),
            "chunk",
            StreamChunk,
            "invalid chunk message: Invalid value 'chunk' - at `$[0]`",
        ),
    ],
    ids=[
        "params.max_tokens",
        "params.stop[0]",
        "params.stop[1]",
        "request_id",
        "load.queued_prefill_tokens",
        "load.queued_prefill_tokens-union",
        "load.prefill_fit_moments[1]",
        "counters.miss_tokens",
        "counters.miss_tokens-key",
        "worker_id",
        "tag",
    ],
)
def test_a_field_error_names_the_field(msg, path, value, kind, message):
    """Structs travel as arrays, so msgspec's path is positions: the codec adds the names."""
    with pytest.raises(ProtocolError) as info:
        decode(_with(msg, path, value), kind)
    assert str(info.value) == message


@pytest.mark.parametrize(
    "msg, path, kind, message",
    [
        (
            POLL_RESULT,
            (8, 5, "cold"),
            PollResult,
            "invalid poll_result message: Expected `int`, got `str` - at `$[8][5][...]` "
            "(counters.miss_tokens[...])",
        ),
        (
            next(m for m in SAMPLE_MSGS if isinstance(m, StreamChunk) and m.miss),
            (7, "cached"),
            StreamChunk,
            "invalid chunk message: Expected `int`, got `str` - at `$[7][...]` (miss[...])",
        ),
    ],
    ids=["counters.miss_tokens[...]", "miss[...]"],
)
def test_a_dict_entry_error_names_the_field(msg, path, kind, message):
    with pytest.raises(ProtocolError) as info:
        decode(_with(msg, path, "many"), kind)
    assert str(info.value) == message


@pytest.mark.parametrize(
    "msg, path, value, kind, message",
    [
        (
            ONE_OF_EACH[ErrorInfo],
            (1,),
            "`$[3]`",
            ErrorInfo,
            # names '(param)' instead
            "invalid error message: Invalid enum value '`$[3]`' - at `$[1]` (kind)",
        ),
        (
            GENERATE,
            (3, 5),
            ["`$[2]`", ""],
            GenerateRequest,
            # names '(prompt_ids)' instead
            "invalid generate message: SamplingParams.stop must be a list of non-empty "
            "strings, got ('`$[2]`', '') - at `$[3]` (params)",
        ),
    ],
    ids=["enum-value", "stop-string"],
)
def test_a_quoted_value_does_not_change_the_field_name(msg, path, value, kind, message):
    with pytest.raises(ProtocolError) as info:
        decode(_with(msg, path, value), kind)
    assert str(info.value) == message


# ---------------------------------------------------------------------------- SamplingParams


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_tokens", 0),
        ("max_tokens", -1),
        ("max_tokens", True),
        ("max_tokens", 1.0),
        ("max_tokens", "16"),
        ("temperature", -1),
        ("temperature", 100.01),
        ("temperature", math.nan),
        ("temperature", "1"),
        ("temperature", False),
        ("top_p", 0),
        ("top_p", 0.0),
        ("top_p", 1.01),
        ("top_p", None),
        ("top_k", 0),
        ("top_k", -2),
        ("top_k", 5.0),
        ("top_k", True),
        ("seed", 2**63),
        ("seed", -(2**63) - 1),
        ("seed", True),
        ("seed", "7"),
        ("stop", [""]),
        ("stop", ""),
        ("stop", ["a", 1]),
        ("stop", [None]),
        ("stop_token_ids", [-1]),
        ("stop_token_ids", [True]),
        ("stop_token_ids", ["1"]),
    ],
)
def test_sampling_params_refuse_bad_values(field, value):
    with pytest.raises(InvalidRequest) as info:
        SamplingParams(**{field: value})
    err = info.value
    assert isinstance(err, ValueError)
    assert err.param == field
    assert err.kind is ErrorKind.INVALID_REQUEST
    assert err.message.startswith(f"SamplingParams.{field} must be ")
    assert str(err) == err.message


def test_sampling_params_replace_validates_too():
    with pytest.raises(InvalidRequest) as info:
        SamplingParams().replace(top_p=0.0)
    assert info.value.param == "top_p"


def test_sampling_params_accept_their_boundaries():
    for kwargs in (
        {"max_tokens": 1},
        {"temperature": 0},
        {"temperature": 100.0},
        {"top_p": 1.0},
        {"top_p": 1e-9},
        {"top_k": -1},
        {"top_k": 1},
        {"seed": -(2**63)},
        {"seed": 2**63 - 1},
        {"seed": None},
        {"stop_token_ids": [0]},
    ):
        params = SamplingParams(**kwargs)
        assert decode(encode(GenerateRequest("r", [1], params)), GenerateRequest).params == params


def test_sampling_params_normalize_stop_to_a_tuple():
    assert SamplingParams(stop="x").stop == ("x",)
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")
    assert SamplingParams(stop=("a",)).stop == ("a",)
    assert SamplingParams().stop == ()
    assert SamplingParams(stop_token_ids=[3, 4]).stop_token_ids == (3, 4)
    assert SamplingParams(stop="x") == SamplingParams(stop=("x",))


def test_sampling_params_greedy():
    assert SamplingParams(temperature=0.0).greedy
    assert SamplingParams(top_k=1).greedy
    assert not SamplingParams(temperature=0.5, top_k=2).greedy


# ---------------------------------------------------------------------------- StreamChunk.merge


def test_merge_concatenates_and_takes_the_later_final_fields():
    first = StreamChunk([1, 2], "ab", cached_tokens=3)
    later = StreamChunk(
        [3],
        "c",
        cached_tokens=4,
        finish_reason="length",
        prompt_tokens=10,
        completion_tokens=3,
        miss={"cached": 4, "cold": 6},
    )
    merged = first.merge(later)
    assert merged == StreamChunk([1, 2, 3], "abc", 4, "length", 10, 3, {"cached": 4, "cold": 6})
    assert merged.final
    assert not first.final
    # The inputs are left as they were.
    assert first == StreamChunk([1, 2], "ab", cached_tokens=3)
    assert later.token_ids == [3]


def test_merge_drops_the_earlier_final_fields():
    earlier = StreamChunk([1], "a", 2, "stop", 5, 1, {"cached": 5})
    merged = earlier.merge(StreamChunk([], "", 2))
    assert merged == StreamChunk([1], "a", 2)
    assert not merged.final


@H
@given(stream_chunks, stream_chunks, stream_chunks)
def test_merge_properties(a, b, c):
    m = a.merge(b)
    assert m.token_ids == a.token_ids + b.token_ids
    assert m.text == a.text + b.text
    assert (m.cached_tokens, m.finish_reason, m.prompt_tokens, m.completion_tokens, m.miss) == (
        b.cached_tokens,
        b.finish_reason,
        b.prompt_tokens,
        b.completion_tokens,
        b.miss,
    )
    assert a.merge(b).merge(c) == a.merge(b.merge(c))
    assert decode(encode(m), StreamChunk) == m


# ---------------------------------------------------------------------------- errors


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("param", ["prompt", None])
def test_error_info_gives_back_the_same_exception(cls, param):
    original = cls("something went wrong: 42", param)
    info = ErrorInfo.of(original)
    assert info == ErrorInfo(cls.kind, "something went wrong: 42", param)
    for carried in (info, decode(encode(info), ErrorInfo)):
        back = carried.exception()
        assert type(back) is cls
        assert back is not original
        assert (back.message, back.param, str(back)) == (
            "something went wrong: 42",
            param,
            back.message,
        )
        assert back.kind is cls.kind
        assert repr(back) == f"{cls.__name__}('something went wrong: 42', param={param!r})"


def test_error_for_maps_every_kind():
    expected = {
        ErrorKind.INVALID_REQUEST: InvalidRequest,
        ErrorKind.ENGINE_FAILURE: EngineFailure,
        ErrorKind.WORKER_UNAVAILABLE: WorkerUnavailable,
        ErrorKind.OVERLOADED: Overloaded,
        ErrorKind.ABORTED: Aborted,
    }
    assert set(expected) == set(ErrorKind)
    for kind, cls in expected.items():
        err = error_for(kind, "msg", "p")
        assert type(err) is cls
        assert (err.kind, err.message, err.param) == (kind, "msg", "p")
        assert isinstance(err, RequestError)
        assert error_for(kind, "msg").param is None
    assert {k.value for k in ErrorKind} == {
        "invalid_request",
        "engine_failure",
        "worker_unavailable",
        "overloaded",
        "aborted",
    }


def test_error_class_hierarchy():
    assert issubclass(InvalidRequest, ValueError)
    assert issubclass(ProtocolError, ValueError)
    for cls in (EngineFailure, WorkerUnavailable, Overloaded):
        assert issubclass(cls, RuntimeError)
    assert not issubclass(Aborted, (ValueError, RuntimeError))


# ---------------------------------------------------------------------------- size limit


def test_the_default_size_limit():
    assert codec.MAX_MESSAGE_BYTES == 64 << 20
    data = bytes(codec.MAX_MESSAGE_BYTES + 1)
    with pytest.raises(ProtocolError) as info:
        decode(data, GenerateRequest)
    assert str(info.value) == f"message of {len(data)} bytes exceeds {64 << 20}"


def test_a_message_over_the_limit_is_refused(monkeypatch):
    msg = ONE_OF_EACH[PollResult]
    data = encode(msg)
    monkeypatch.setattr(codec, "MAX_MESSAGE_BYTES", len(data))
    assert decode(data, PollResult) == msg  # exactly at the limit: fine
    monkeypatch.setattr(codec, "MAX_MESSAGE_BYTES", len(data) - 1)
    for buf in (data, bytearray(data), memoryview(data)):
        with pytest.raises(ProtocolError) as info:
            decode(buf, PollResult)
        assert str(info.value) == f"message of {len(data)} bytes exceeds {len(data) - 1}"
    # Refused before msgpack looks at it: garbage over the limit is "too big", not "malformed".
    monkeypatch.setattr(codec, "MAX_MESSAGE_BYTES", 50)
    with pytest.raises(ProtocolError) as info:
        decode(b"\xc1" * 51, PollResult)
    assert str(info.value) == "message of 51 bytes exceeds 50"


def test_merge_joins_the_logprobs():
    a = StreamChunk([1], "a", logprobs=[TokenLogprob(-1.0)], prompt_logprobs=[None])
    b = StreamChunk([2], "b", 0, "stop", 2, 2, {}, [TokenLogprob(-2.0, [2], [-2.0])])
    m = a.merge(b)
    assert m.logprobs == [TokenLogprob(-1.0), TokenLogprob(-2.0, [2], [-2.0])]
    assert m.prompt_logprobs == [None]
    assert StreamChunk([1], "a").merge(StreamChunk([2], "b")).logprobs is None
