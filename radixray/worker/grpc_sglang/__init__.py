"""SGLang's scheduler service over gRPC (``radixray worker --grpc-port``), for SGLang's gateway.

smg (1.13.0) indexes a worker's KV cache from its events only when the worker speaks gRPC: it
registers ``grpc://host:port``, finds the runtime by calling ``HealthCheck`` on each service it
knows (``sglang.grpc.scheduler.SglangScheduler`` first), tokenizes prompts itself (with the
tokenizer the worker streams it, ``GetTokenizer``), sends ``Generate`` with token ids and
subscribes to ``SubscribeKvEvents``, whose stored blocks (with their token ids) feed its
event-driven cache-aware policy. This package serves that over one worker's engine:

* ``service.py``: the methods (Generate, Abort, HealthCheck, GetModelInfo, GetServerInfo,
  GetLoads, GetTokenizer, SubscribeKvEvents), bound from the generated service descriptor;
* ``convert.py``: SGLang's sampling parameters and responses to and from radixray's protocol;
* ``kv_relay.py``: the worker's KV events as the gateway's event batches (numbering, replay,
  snapshots);
* ``tokenizer_files.py``: the tokenizer as HF files in a zip archive;
* ``server.py``: the server, on a thread of its own beside the HTTP one;
* ``*.proto`` and the generated ``*_pb2.py`` (``make grpc-stubs``): our subset of the interface,
  with the gateway's package, service, message names and field numbers.

See docs/peers/smg.md, "Event-driven routing over gRPC".
"""

from .server import GrpcServer, start_beside_http

__all__ = ["GrpcServer", "start_beside_http"]
