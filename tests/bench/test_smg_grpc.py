"""SGLang's gateway (``smg``, the release pinned in pyproject) in its event-driven cache-aware
mode, in front of real ``radixray worker --grpc-port`` processes: it registers them over gRPC,
loads the tokenizer they stream, serves a completion through ``Generate``, and indexes their KV
events. Proof that the events arrived: its ``smg_kv_index_blocks`` gauge counts each worker's
pages, and prompts whose prefix only a worker's events told it about (the prefix was sent to
that worker directly, never through smg) go to that worker every time."""

from __future__ import annotations

import re
import time

import grpc
import httpx
import pytest
from google.protobuf import message_factory
from tokenizers import Tokenizer

from radixray.bench.local_cluster import WorkerSpec, start_smg_router, start_workers
from radixray.bench.peer_smg import smg_available
from radixray.worker.grpc_sglang import sglang_scheduler_pb2 as pb
from radixray.worker.grpc_sglang.service import SERVICE
from radixray.worker.grpc_sglang.tokenizer_files import byte_tokenizer_json

from ..router.serving import free_port, free_ports

pytestmark = [pytest.mark.integration]

PAGE = 16
W, D = range(2), range(3)  # workers, documents per worker


def _ports(n: int, taken: set[int]) -> tuple[int, ...]:
    out: list[int] = []
    while len(out) < n:
        p = free_port()
        if p not in taken and p not in out:
            out.append(p)
    return tuple(out)


def index_blocks(metrics_url: str) -> dict[str, float]:
    """smg's ``smg_kv_index_blocks`` gauge: worker URL -> blocks its event index holds."""
    text = httpx.get(metrics_url, timeout=5).text
    pat = r'^smg_kv_index_blocks\{[^}]*worker="([^"]+)"[^}]*\}\s+(\S+)'
    return {m[1]: float(m[2]) for m in re.finditer(pat, text, re.M)}


def complete(url: str, prompt: str, max_tokens: int = 2) -> dict:
    body = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    r = httpx.post(url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def greedy_ids(port: int, ids: list[int], n: int) -> list[int]:
    """The tokens the worker's gRPC service generates for ``ids`` (greedy, ``n`` of them)."""
    m = SERVICE.methods_by_name["Generate"]
    sp = pb.SamplingParams(temperature=0, top_p=1, top_k=-1, max_new_tokens=n, ignore_eos=True)
    req = pb.GenerateRequest(
        request_id="direct", tokenized=pb.TokenizedInput(input_ids=ids), sampling_params=sp
    )
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_stream(
            f"/{SERVICE.full_name}/Generate",
            request_serializer=lambda x: x.SerializeToString(),
            response_deserializer=message_factory.GetMessageClass(m.output_type).FromString,
        )
        (done,) = list(call(req, timeout=60))
    return list(done.complete.output_ids)


def cached(answer: dict) -> int:
    return (answer["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def test_smg_event_driven_routing_over_grpc(tmp_path):
    assert smg_available() is None  # smg is a dev dependency: its absence is a failure here
    spec = WorkerSpec(model="tiny", page_size=PAGE, num_pages=256)
    base = free_ports(2)
    grpc_ports = _ports(2, {base, base + 1})
    workers = start_workers(2, base, spec, tmp_path, grpc_ports=grpc_ports)
    grpc_urls = [f"grpc://127.0.0.1:{p}" for p in grpc_ports]
    router, prom = None, free_port()
    try:
        router = start_smg_router(free_port(), grpc_urls, "cache_aware", tmp_path, prom)
        # A completion through smg: it tokenized the prompt with the worker's tokenizer, sent
        # token ids, and detokenized the answer.
        answer = complete(router.url, "hello smg", 3)
        assert answer["usage"]["completion_tokens"] == 3
        assert answer["usage"]["prompt_tokens"] == len(b"hello smg")  # a byte a token
        # Greedy: the tokens a worker's service generates for those ids, decoded by the
        # tokenizer it streamed (HF's decode: an invalid UTF-8 run is one U+FFFD per byte token).
        # Asked of both workers: the one smg did not pick computes the prompt cold, as smg's
        # worker did (the other reuses its cached pages, and a random tiny model's near-tied
        # logits may then pick another token).
        tok = Tokenizer.from_str(byte_tokenizer_json())
        direct = {tok.decode(greedy_ids(p, list(b"hello smg"), 3)) for p in grpc_ports}
        assert answer["choices"][0]["text"] in direct, (answer["choices"][0]["text"], direct)
        # Each worker gets long prefixes of its own straight over HTTP: smg routed none of them.
        docs = {(i, j): f"[{i}.{j}] a document held by worker {i}. " * 8 for i in W for j in D}
        for (i, _), doc in docs.items():
            complete(workers[i].url, doc + "first", 1)
        pages = {d: len(doc.encode()) // PAGE for d, doc in docs.items()}
        need = {i: sum(pages[i, j] for j in D) for i in W}
        metrics, deadline, seen = f"http://127.0.0.1:{prom}/metrics", time.monotonic() + 20, {}
        while time.monotonic() < deadline:
            seen = index_blocks(metrics)
            if all(seen.get(grpc_urls[i], 0) >= need[i] for i in W):
                break
            time.sleep(0.3)
        assert all(seen.get(grpc_urls[i], 0) >= need[i] for i in W), (seen, need)
        # The same prefixes through smg, one request at a time (equal load): each goes to the
        # worker whose events told smg it holds the prefix (a hit there, and only there: the
        # other never saw it), every time. Without the events, smg would place each first
        # request at random (1 in 2**6 to get all six right).
        for k in range(2):
            for (i, j), doc in docs.items():
                hit = cached(complete(router.url, doc + f"question {k}", 1))
                assert hit >= pages[i, j] * PAGE, (k, i, j, hit)
    except BaseException:
        for p in (router, *workers):
            if p is not None:
                print(f"--- {p.name}\n{p.tail(40)}")
        raise
    finally:
        for p in (router, *workers):
            if p is not None:
                p.stop()
