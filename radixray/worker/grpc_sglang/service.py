"""``SglangScheduler`` over one worker's engine: what SGLang's gateway (smg) calls on a gRPC
worker. The methods are bound from the generated service descriptor (``bind``), so the generated
code is the protobuf messages alone."""

from __future__ import annotations

import datetime

import grpc
from google.protobuf import message_factory

from radixray.protocol import AbortRequest, RequestError

from .. import sglang_compat
from . import sglang_scheduler_pb2 as pb
from . import smg_common_pb2 as common
from .convert import Responses, generate_request, status_code
from .kv_relay import KvEventRelay
from .tokenizer_files import tokenizer_files, tokenizer_zip, zip_chunks

__all__ = ["SglangScheduler", "bind", "SERVICE", "VERSION"]

SERVICE = pb.DESCRIPTOR.services_by_name["SglangScheduler"]
VERSION = "radixray-0.1.0"


class SglangScheduler:
    """The service's methods, named as in the .proto (``bind`` finds them by name)."""

    def __init__(self, host, meta, relay: KvEventRelay):
        """``host``: the ``WorkerHost``; ``meta``: the served model (``ModelMeta``)."""
        self.host = host
        self.meta = meta
        self.relay = relay
        self._tokenizer_zip: bytes | None = None
        # The requests Generate runs now: Abort stops these only (not one another client of the
        # worker started over HTTP, which only the cluster token may abort).
        self._running: set[str] = set()

    # ------------------------------------------------------------------ serving

    async def Generate(self, request: pb.GenerateRequest, context):
        engine = self.host.engine
        try:
            req = generate_request(request, self.meta.max_model_len)
            agen = self.host.generate(req)
        except RequestError as e:
            await context.abort(status_code(e), e.message)
        stops = set() if req.params.ignore_eos else set(engine.tokenizer.stop_token_ids)
        out = Responses(req.request_id, len(req.prompt_ids), request.stream, stops)
        out.stop_ids |= set(req.params.stop_token_ids)
        first = True
        self._running.add(req.request_id)
        try:
            async for chunk in agen:
                if first:  # prefilled: its pages are in the cache, tell the subscribers now
                    self.relay.kick()
                    first = False
                for response in out.of(chunk):
                    yield response
        except RequestError as e:
            await context.abort(status_code(e), e.message)
        finally:
            self._running.discard(req.request_id)
            await agen.aclose()  # before the end (the caller left): aborts the request
            self.relay.kick()

    async def Abort(self, request: pb.AbortRequest, context) -> pb.AbortResponse:
        if request.request_id not in self._running:
            return pb.AbortResponse(success=False, message="no such request in flight here")
        await self.host.abort(AbortRequest(request.request_id))
        return pb.AbortResponse(success=True)

    async def HealthCheck(self, request, context) -> pb.HealthCheckResponse:
        h = await self.host.health()
        return pb.HealthCheckResponse(healthy=h.ok, message=h.detail or "ok")

    # ------------------------------------------------------------------ metadata

    async def GetModelInfo(self, request, context) -> pb.GetModelInfoResponse:
        tok, meta = self.meta.tokenizer, self.meta
        eos = sorted(set(tok.stop_token_ids) | {tok.eos_token_id} - {None})
        arch = getattr(meta.config, "architecture", "") or ""
        return pb.GetModelInfoResponse(
            model_path=meta.name,
            tokenizer_path="",  # none on the gateway's host: it asks GetTokenizer
            is_generation=True,
            served_model_name=meta.name,
            max_context_length=meta.max_model_len,
            vocab_size=meta.vocab_size,
            model_type=arch,
            eos_token_ids=eos,
            pad_token_id=tok.pad_token_id or 0,
            bos_token_id=tok.bos_token_id or 0,
            max_req_input_len=meta.max_model_len - 1,
            architectures=[arch] if arch else [],
        )

    async def GetServerInfo(self, request, context) -> pb.GetServerInfoResponse:
        engine, meta = self.host.engine, self.meta
        s = engine.stats()
        total_tokens = s["total_pages"] * s["page_size"]
        reply = pb.GetServerInfoResponse(
            active_requests=s["running"] + s["waiting"],
            uptime_seconds=(await self.host.health()).uptime_s,
            sglang_version=VERSION,
            server_type="grpc",
            max_total_num_tokens=total_tokens,
        )
        reply.server_args.update(
            {
                "model_path": meta.name,
                "served_model_name": meta.name,
                "tp_size": 1,
                "dp_size": 1,
                "context_length": meta.max_model_len,
                "max_total_tokens": total_tokens,
                "max_running_requests": engine.scheduler.config.max_running,
                "page_size": engine.page_size,
            }
        )
        return reply

    async def GetLoads(self, request: pb.GetLoadsRequest, context) -> pb.GetLoadsResponse:
        engine = self.host.engine
        query = f"include={','.join(request.include) or 'core'}".encode()
        status, body = sglang_compat.loads(
            engine.stats(), engine.scheduler.config.max_running, query
        )
        if status != 200:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, body["error"])
        (rank,) = body["loads"]
        queues = rank.pop("queues", None)
        rank.pop("timestamp", None)
        for k in ("num_used_tokens", "max_total_num_tokens", "num_waiting_uncached_tokens"):
            rank[k] = min(int(rank[k]), 2**31 - 1)
        load = pb.SchedulerLoad(num_total_reqs=rank["num_running_reqs"] + rank["num_waiting_reqs"])
        for k, v in rank.items():
            setattr(load, k, v)
        if queues is not None:
            load.queues.CopyFrom(pb.QueueMetrics(**queues))
        stamp = datetime.datetime.now(datetime.timezone.utc).isoformat()
        return pb.GetLoadsResponse(
            timestamp=stamp,
            version=VERSION,
            dp_rank_count=1,
            loads=[load],
            aggregate=pb.AggregateMetrics(
                total_running_reqs=load.num_running_reqs,
                total_waiting_reqs=load.num_waiting_reqs,
                total_reqs=load.num_total_reqs,
                avg_token_usage=load.token_usage,
                avg_throughput=load.gen_throughput,
                avg_utilization=load.utilization,
            ),
        )

    async def GetTokenizer(self, request, context):
        if self._tokenizer_zip is None:
            try:
                files = tokenizer_files(self.meta.tokenizer, self.meta.max_model_len)
            except ValueError as e:
                await context.abort(grpc.StatusCode.UNIMPLEMENTED, str(e))
            self._tokenizer_zip = tokenizer_zip(files)
        for data, sha in zip_chunks(self._tokenizer_zip):
            yield common.GetTokenizerChunk(data=data, sha256=sha)

    # ------------------------------------------------------------------ KV events

    async def SubscribeKvEvents(self, request: common.SubscribeKvEventsRequest, context):
        async for batch in self.relay.subscribe(request.start_sequence_number):
            yield batch


def bind(servicer) -> grpc.GenericRpcHandler:
    """The handlers of every method ``SERVICE`` declares, each calling ``servicer``'s method of
    the same name (requests parsed into, and replies serialized from, the generated classes)."""
    handlers = {}
    for m in SERVICE.methods:
        request_cls = message_factory.GetMessageClass(m.input_type)
        make = grpc.unary_stream_rpc_method_handler
        if not m.server_streaming:
            make = grpc.unary_unary_rpc_method_handler
        handlers[m.name] = make(
            getattr(servicer, m.name),
            request_deserializer=request_cls.FromString,
            response_serializer=lambda msg: msg.SerializeToString(),
        )
    return grpc.method_handlers_generic_handler(SERVICE.full_name, handlers)
