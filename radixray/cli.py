"""``radixray serve | worker | sim | bench``: the command line."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import sys

from radixray.api.server import serve_uvicorn
from radixray.router.cli_args import add_router_arguments, router_settings
from radixray.router.policies import make_policy
from radixray.settings import add_arguments, from_args

__all__ = ["main", "build_parser"]

log = logging.getLogger("radixray")
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _engine_args(p: argparse.ArgumentParser) -> None:
    """The engine's flags, generated from EngineConfig (its defaults and help are there)."""
    from radixray.worker.engine_config import EngineConfig

    add_arguments(p.add_argument_group("engine (EngineConfig)"), EngineConfig)


def _engine_config(args, worker_id: str | None):
    """The EngineConfig the flags describe."""
    from radixray.worker.engine_config import EngineConfig

    return from_args(EngineConfig, args, worker_id=worker_id)


def _cluster_token_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cluster-token",
        default=os.environ.get("RADIXRAY_CLUSTER_TOKEN"),
        help="shared token of the workers' internal routes (default $RADIXRAY_CLUSTER_TOKEN); "
        "a worker listening beyond loopback without one generates one and prints it",
    )


def _start_ray(args) -> bool:
    """Join or start Ray; whether the workers get a GPU each. On CPU the workers split the
    cores unless --cpu-threads says otherwise."""
    import ray

    from radixray.deploy.ray_cluster import NAMESPACE

    # One namespace, so that a second router (--join) finds the workers by name.
    if args.address:
        ray.init(address=args.address, log_to_driver=False, namespace=NAMESPACE)
    else:
        ray.init(include_dashboard=False, log_to_driver=False, namespace=NAMESPACE)
    use_gpu = ray.cluster_resources().get("GPU", 0) >= 1 and args.device != "cpu"
    if not use_gpu and args.cpu_threads is None:
        args.cpu_threads = max(1, (os.cpu_count() or 1) // max(args.workers, 1))
    return use_gpu


def _print_ready(url: str, args, model_name: str) -> None:
    print(f"radixray router on {url} (policy {args.policy}, {args.workers} workers)")
    print(
        f"""  curl {url}/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "{model_name}", "messages": [{{"role": "user", "content": "Hi!"}}]}}'""",
        flush=True,
    )


def _preload(model: str):
    """The router's model metadata, and the modules cmd_serve needs after Ray is up (the worker
    actor's class imports torch): loaded on a thread while Ray starts, which is mostly a wait on
    Ray's own processes (on a saturated machine the two only share the cores)."""
    import radixray.router.app  # noqa: F401
    import radixray.worker.actor  # noqa: F401
    from radixray.model_meta import load_model_meta

    return load_model_meta(model)


def _actor_spawner(args, use_gpu: bool):
    """``spawn({"worker_id": ..., engine fields...})``: a worker actor that starts loading its
    model now; the flags' EngineConfig under the spec's fields (an admin request's)."""
    from radixray.deploy.ray_cluster import ACTOR_PREFIX
    from radixray.worker.actor import WorkerActor, worker_actor_options

    engine = _engine_config(args, None)
    options = worker_actor_options(
        use_gpu, num_cpus=args.worker_cpus, resources=args.worker_resources
    )

    def spawn(spec: dict):
        wid = spec["worker_id"]
        cfg = type(engine)(**(dataclasses.asdict(engine) | spec))  # a bad field: ValueError
        actor = WorkerActor.options(
            name=f"{ACTOR_PREFIX}{wid}", scheduling_strategy="SPREAD", **options
        )
        return actor.remote(cfg, wid)

    return spawn


def cmd_serve(args) -> int:
    if args.worker_urls:
        return _serve_http_workers(args)
    from concurrent.futures import ThreadPoolExecutor

    import ray

    from radixray.deploy.ray_cluster import NAMESPACE, actor_client, cluster_token, named_workers

    with ThreadPoolExecutor(1, thread_name_prefix="radixray-preload") as pool:
        preload = pool.submit(_preload, args.model)
        use_gpu = _start_ray(args)
        meta = preload.result()
    from radixray.router.app import build_app
    from radixray.router.fleet_metrics import RayKVStore
    from radixray.router.service import RouterService

    token = cluster_token(args.cluster_token)
    spawn = _actor_spawner(args, use_gpu)

    async def factory(spec: dict):
        wid = spec["worker_id"]
        return await actor_client(spawn(spec), wid, args.worker_transport, token, owned=True)

    # Our workers start loading now, while the router sets itself up.
    if not args.join:
        print(f"starting {args.workers} workers ({args.model}) ...", flush=True)
    ids = [] if args.join else [f"worker-{i}" for i in range(args.workers)]
    handles = {wid: spawn({"worker_id": wid}) for wid in ids}
    service = RouterService(meta, router_settings(args, args.policy), worker_factory=factory)
    service.share_metrics(RayKVStore(NAMESPACE))  # /metrics of any router covers the fleet

    async def start_workers():
        owned = not args.join
        if args.join:
            handles.update(named_workers())
            print(f"joining {len(handles)} running workers", flush=True)
        clients = await asyncio.gather(
            *(
                actor_client(h, wid, args.worker_transport, token, owned=owned)
                for wid, h in handles.items()
            )
        )
        await asyncio.gather(*(service.add_worker(c) for c in clients))

    app = build_app(service, on_startup=[start_workers])
    url = f"http://{args.host}:{args.port}"
    try:
        serve_uvicorn(app, args.host, args.port, lambda: _print_ready(url, args, meta.name))
    finally:
        if args.join:  # the workers belong to the router that started them
            asyncio.run(service.stop())
        else:
            asyncio.run(service.close())
        ray.shutdown()
    return 0


def _json_dict(text: str) -> dict:
    value = json.loads(text)
    if not isinstance(value, dict) or not all(
        isinstance(v, (int, float)) and v > 0 for v in value.values()
    ):
        raise argparse.ArgumentTypeError(f"expected a JSON object of positive numbers: {text}")
    return value


def _serve_http_workers(args) -> int:
    """The router in front of running ``radixray worker`` processes (no Ray): it polls their
    KV events over HTTP as it polls actors."""
    from radixray.model_meta import load_model_meta
    from radixray.router.app import build_app
    from radixray.router.service import RouterService

    meta = load_model_meta(args.model)
    service = RouterService(meta, router_settings(args, args.policy))
    clients = asyncio.run(_connect_http_workers(args.worker_urls, args.cluster_token))

    async def add_workers():
        await asyncio.gather(*(service.add_worker(c) for c in clients))

    app = build_app(service, on_startup=[add_workers])

    def ready():
        n, url = len(args.worker_urls), f"http://{args.host}:{args.port}"
        print(f"radixray router on {url} (policy {args.policy}, {n} HTTP workers)", flush=True)

    try:
        serve_uvicorn(app, args.host, args.port, ready)
    finally:
        asyncio.run(service.close())
    return 0


async def _connect_http_workers(urls: list[str], token: str | None) -> list:
    """A client per worker URL, named by the worker itself. Refuses to start (a clear message,
    no traceback) when a worker cannot be reached or two workers claim one id."""
    from radixray.protocol import RequestError, WorkerClient
    from radixray.protocol.http_transport import HttpTransport

    clients = [WorkerClient(HttpTransport(u, token)) for u in urls]
    try:
        infos = await asyncio.gather(*(c.info() for c in clients))
    except RequestError as e:
        raise SystemExit(f"radixray serve: {e.message}") from None
    finally:
        # The sessions belong to this event loop; the server's loop opens its own.
        await asyncio.gather(*(c.close() for c in clients))
    seen: dict[str, str] = {}
    for url, c, info in zip(urls, clients, infos, strict=True):
        c.worker_id = info.worker_id
        if info.worker_id in seen:
            raise SystemExit(
                f"radixray serve: two workers claim the worker id {info.worker_id!r}: "
                f"{seen[info.worker_id]} and {url}; start each with its own --worker-id"
            )
        seen[info.worker_id] = url
    return clients


def cmd_worker(args) -> int:
    """One engine over HTTP: the worker protocol for radixray's router, the probes SGLang's
    router needs, and the OpenAI API."""
    import secrets
    import socket

    from radixray.worker.host import WorkerHost
    from radixray.worker.http_server import WorkerServer

    token = args.cluster_token
    if token is None and args.host not in _LOOPBACK:
        token = secrets.token_urlsafe(32)
        print(
            f"radixray worker listens on {args.host}: its internal routes need a cluster token; "
            f"generated one (pass it to the router as --cluster-token):\n  {token}",
            file=sys.stderr,
            flush=True,
        )
    name = socket.gethostname() if args.host in ("0.0.0.0", "::") else args.host
    address = f"http://{name}:{args.port}"
    worker_id = args.worker_id or f"{name}:{args.port}"
    from radixray.kernels import BackendUnavailableError

    try:
        host = WorkerHost(_engine_config(args, worker_id), worker_id, address)
    except (ValueError, BackendUnavailableError) as e:  # a setting this machine cannot run
        print(f"radixray worker: cannot start: {e}", file=sys.stderr, flush=True)
        return 2
    app = WorkerServer(host, token=token)
    grpc_server = None
    if args.grpc_port is not None:
        from radixray.worker.grpc_sglang import start_beside_http

        grpc_server = start_beside_http(host, app.meta, args.host, args.grpc_port)
        if grpc_server is None:
            host.shutdown()
            return 2

    def ready():
        print(f"radixray worker {worker_id} on http://{args.host}:{args.port}", flush=True)

    try:
        serve_uvicorn(app, args.host, args.port, ready)
    finally:
        if grpc_server is not None:
            grpc_server.stop()
        host.shutdown()
    return 0


def cmd_sim(argv: list[str]) -> int:
    from radixray.sim.sim_cli import main as sim_main

    return sim_main(argv)


def cmd_bench(argv: list[str]) -> int:
    from radixray.bench.bench_cli import main as bench_main

    return bench_main(argv)


def _serve_args(p: argparse.ArgumentParser) -> None:
    # the Serve app's defaults too
    from radixray.deploy.serve_config import WorkerDeploymentConfig as Workers

    p.add_argument("--workers", type=int, default=Workers.num_replicas)
    p.add_argument(
        "--address", default=None, help="Ray address (auto, ray://...); default: start a local Ray"
    )
    p.add_argument(
        "--worker-resources",
        type=_json_dict,
        default=None,
        help="custom Ray resources each worker needs, to pin workers to labelled nodes: "
        "'{\"gpu_pool_a\": 1}'",
    )
    p.add_argument(
        "--join",
        action="store_true",
        help="start no workers: route to the running ones (a second router replica on the "
        "same cluster; use with --address)",
    )
    p.add_argument(
        "--worker-cpus",
        type=float,
        default=Workers.num_cpus,
        help="CPUs reserved per CPU worker (fractions let 2 workers share a core)",
    )
    p.add_argument(
        "--worker-transport",
        choices=["http", "ray"],
        default="http",
        help="how requests reach the worker actors: each actor's own HTTP server (default; "
        "behind the cluster token) or Ray actor calls",
    )
    p.add_argument(
        "--worker-urls",
        nargs="+",
        default=None,
        help="front running `radixray worker` processes over HTTP instead of starting Ray actors",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixray", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="start Ray workers and the router (OpenAI API)")
    _serve_args(s)
    _engine_args(s)
    add_router_arguments(s)
    _cluster_token_arg(s)
    w = sub.add_parser("worker", help="one engine over HTTP (for a router, or OpenAI clients)")
    w.add_argument(
        "--worker-id", default=None, help="the id routers know it by (default: host:port)"
    )
    w.add_argument("--host", default="127.0.0.1")
    w.add_argument("--port", type=int, default=9001)
    w.add_argument(
        "--grpc-port",
        type=int,
        default=None,
        help="also serve SGLang's gRPC scheduler service on this port (same engine): smg's "
        "event-driven cache-aware routing (smg --worker-urls grpc://HOST:PORT; docs/peers/smg.md)",
    )
    _engine_args(w)
    _cluster_token_arg(w)
    sub.add_parser("sim", help="trace-driven routing simulator (see radixray sim --help)")
    sub.add_parser("bench", help="live serving benchmark (see radixray bench --help)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "sim":
        return cmd_sim(argv[1:])
    if argv and argv[0] == "bench":
        return cmd_bench(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:  # a setting no engine (or policy) accepts stops here, before Ray or a model starts
        _engine_config(args, None)
        if args.cmd == "serve":
            make_policy(router_settings(args, args.policy).policy)
    except ValueError as e:
        parser.error(str(e))
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.cmd == "serve":
        return cmd_serve(args)
    if args.cmd == "worker":
        return cmd_worker(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
