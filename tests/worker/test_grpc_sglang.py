"""SGLang's scheduler service over a real engine (``radixray worker --grpc-port``), called as
SGLang's gateway calls it: the tokenizer it streams is the byte tokenizer, Generate answers
token ids with SGLang's chunks and completion, and SubscribeKvEvents carries the stored pages
with their tokens, numbered, replayable and as a snapshot."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile

import grpc
import pytest
from google.protobuf import message_factory
from tokenizers import Tokenizer

from radixray.model_meta import ModelMeta
from radixray.model_meta.byte_tokenizer import ByteTokenizer
from radixray.worker import WorkerHost
from radixray.worker.grpc_sglang import GrpcServer
from radixray.worker.grpc_sglang import sglang_scheduler_pb2 as pb
from radixray.worker.grpc_sglang import smg_common_pb2 as common
from radixray.worker.grpc_sglang.kv_relay import signed64
from radixray.worker.grpc_sglang.service import SERVICE
from tests.router.serving import wait_for

PAGE = 4


@pytest.fixture(scope="module")
def served():
    """``(call, host, server)``: ``call(method, request)`` over a channel to the service."""
    host = WorkerHost({"model": "tiny", "page_size": PAGE, "num_pages": 64}, "g0")
    e = host.engine
    meta = ModelMeta("tiny", e.tokenizer, e.model_config, e.max_model_len)
    server = GrpcServer(host, meta, "127.0.0.1:0")
    port = server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")

    def call(name: str, request, **kw):
        m = SERVICE.methods_by_name[name]
        stub = channel.unary_stream if m.server_streaming else channel.unary_unary
        return stub(
            f"/{SERVICE.full_name}/{name}",
            request_serializer=lambda x: x.SerializeToString(),
            response_deserializer=message_factory.GetMessageClass(m.output_type).FromString,
        )(request, **kw)

    yield call, host, server
    channel.close()
    server.stop()
    host.shutdown()


def generate(call, rid: str, ids: list[int], n_new: int, stream: bool = False) -> list:
    sp = pb.SamplingParams(temperature=0, top_p=1, top_k=-1, max_new_tokens=n_new, ignore_eos=True)
    req = pb.GenerateRequest(
        request_id=rid,
        tokenized=pb.TokenizedInput(input_ids=ids),
        sampling_params=sp,
        stream=stream,
    )
    return list(call("Generate", req, timeout=60))


def test_metadata_and_the_tokenizer_bundle(served):
    call, host, _ = served
    assert call("HealthCheck", pb.HealthCheckRequest()).healthy
    info = call("GetModelInfo", pb.GetModelInfoRequest())
    assert (info.served_model_name, info.model_path, info.tokenizer_path) == ("tiny", "tiny", "")
    assert ByteTokenizer.EOS_ID in info.eos_token_ids
    server_info = call("GetServerInfo", pb.GetServerInfoRequest())
    assert server_info.server_args["dp_size"] == 1
    assert server_info.max_total_num_tokens == 64 * PAGE
    loads = call("GetLoads", pb.GetLoadsRequest(include=["core", "queues"]))
    assert loads.loads[0].max_total_num_tokens == 64 * PAGE and loads.loads[0].HasField("queues")
    chunks = list(call("GetTokenizer", common.GetTokenizerRequest()))
    data = b"".join(c.data for c in chunks)
    assert [bool(c.sha256) for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1].sha256 == hashlib.sha256(data).hexdigest()
    files = zipfile.ZipFile(io.BytesIO(data))
    tok = Tokenizer.from_str(files.read("tokenizer.json").decode())
    config = json.loads(files.read("tokenizer_config.json"))
    assert config["eos_token"] == "<|im_end|>" and "<|im_start|>" in config["chat_template"]
    byte = ByteTokenizer()
    for text in ("héllo wörld 🎉", "<|im_start|>user\nhi<|im_end|>\n", "a\tb  c\n"):
        ids = tok.encode(text, add_special_tokens=True).ids
        assert ids == byte.encode(text)
        assert tok.decode(ids) == byte.decode(ids)


def test_generate_unary_and_streamed(served):
    call, _, _ = served
    prompt = list(b"the quick brown fox jumps")
    (only,) = generate(call, "u1", prompt, 5)
    done = only.complete
    assert (done.finish_reason, done.completion_tokens, len(done.output_ids)) == ("length", 5, 5)
    assert done.prompt_tokens == len(prompt)
    streamed = generate(call, "s1", prompt, 5, stream=True)
    *chunks, last = streamed
    assert all(r.WhichOneof("response") == "chunk" for r in chunks) and chunks
    assert [t for r in chunks for t in r.chunk.token_ids] == list(last.complete.output_ids)
    assert list(last.complete.output_ids) == list(done.output_ids)  # greedy: the same tokens
    # the prefix hit: every whole page of the repeated prompt but the last token's
    assert last.complete.cached_tokens == (len(prompt) - 1) // PAGE * PAGE
    with pytest.raises(grpc.RpcError) as err:
        generate(call, "bad", [], 2)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_kv_events_stream_replay_and_snapshot(served):
    call, host, server = served
    sub = call("SubscribeKvEvents", common.SubscribeKvEventsRequest(start_sequence_number=0))
    # No cursor: the live set as a snapshot, its first chunk beginning with a clear.
    snap = next(sub)
    assert snap.HasField("snapshot") and snap.snapshot.index == 0 and snap.snapshot.count == 1
    assert snap.events[0].WhichOneof("data") == "cleared"
    assert snap.sequence_number == server.relay.seq
    prompt = [7, 8, 9, 10] + list(range(100, 113))  # 4 full pages and a token
    generate(call, "k1", prompt, 2)
    last, stored = snap.sequence_number, []
    while not stored:  # (the relay's first poll, a clear alone, may come first)
        batch = next(sub)
        assert batch.sequence_number == last + 1 and not batch.HasField("snapshot")
        last = batch.sequence_number
        stored = [e.stored for e in batch.events if e.WhichOneof("data") == "stored"]
    blocks = [b for s in stored for b in s.blocks]
    assert all(b.block_size == PAGE for b in blocks)
    pages = [list(b.token_ids) for b in blocks]
    assert pages[:4] == [prompt[i : i + PAGE] for i in range(0, 16, PAGE)]
    assert not stored[0].HasField("parent_block_hash")  # the chain starts at the root
    sub.cancel()
    # A reconnect from that batch gets what came after it, numbered on.
    generate(call, "k2", list(range(200, 212)), 1)
    wait_for(lambda: server.relay.seq != batch.sequence_number, "the relay numbering k2's events")
    again = call(
        "SubscribeKvEvents",
        common.SubscribeKvEventsRequest(start_sequence_number=batch.sequence_number),
    )
    nxt = next(again)
    assert nxt.sequence_number == batch.sequence_number + 1 and not nxt.HasField("snapshot")
    again.cancel()
    # A cursor the relay never numbered (another incarnation): the live set again, whole.
    other = call("SubscribeKvEvents", common.SubscribeKvEventsRequest(start_sequence_number=5))
    resync = next(other)
    other.cancel()
    assert resync.HasField("snapshot") and resync.sequence_number == server.relay.seq
    hashes = {
        b.block_hash
        for e in resync.events
        if e.WhichOneof("data") == "stored"
        for b in e.stored.blocks
    }
    assert {b.block_hash for b in blocks} <= hashes
    assert all(signed64(h) == h for h in (0, 1, 2**63 - 1)) and signed64(2**64 - 1) == -1
