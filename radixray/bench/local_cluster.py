"""Start and stop the processes of a live benchmark: ``radixray worker`` processes, radixray's
router in front of them (``radixray serve --worker-urls``) and SGLang's (``smg``).

Every process is ours: started with ``subprocess.Popen``, logged to a file, stopped by its pid
(terminate, then kill after a grace period). Nothing else is ever signalled.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from radixray.worker.engine_config import EngineConfig

from .loadgen import RequestResult, stream_request
from .peer_smg import smg_command

__all__ = [
    "Proc",
    "WorkerSpec",
    "start_workers",
    "start_radixray_router",
    "start_radixray_ray_router",
    "start_smg_router",
    "served_name",
    "warm",
]

LOCAL = "127.0.0.1"
CPUs = tuple[int, ...] | None  # the cores a process may run on (None: any)
# The workers' internal routes take this token; the radixray routers started here send it. One
# per benchmark process, passed to the processes it starts through their environment.
CLUSTER_TOKEN = secrets.token_urlsafe(24)


@dataclass
class Proc:
    name: str
    url: str
    popen: subprocess.Popen
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stop(self, grace_s: float = 10.0) -> None:
        if self.popen.poll() is not None:
            return
        self.popen.terminate()
        try:
            self.popen.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(grace_s)

    def tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


@dataclass(frozen=True)
class WorkerSpec:
    """A benchmark's `radixray worker` flags: the tiny model on a small pool and one thread
    (the benchmark's own choices); page size and batch budget are the engine's defaults."""

    model: str = "tiny"
    page_size: int = EngineConfig.page_size
    num_pages: int | None = 768
    cpu_threads: int = 1
    max_batch_tokens: int = EngineConfig.max_batch_tokens
    host_pages: int | None = None  # None: the engine's default (0 on the CPU); 0: off
    extra: tuple[str, ...] = field(default_factory=tuple)

    def args(self) -> list[str]:
        a = ["--model", self.model, "--page-size", str(self.page_size)]
        a += ["--cpu-threads", str(self.cpu_threads)]
        a += ["--max-batch-tokens", str(self.max_batch_tokens)]
        if self.num_pages:
            a += ["--num-pages", str(self.num_pages)]
        if self.host_pages is not None:
            a += ["--host-pages", str(self.host_pages)]
        return a + list(self.extra)


def _spawn(name: str, cmd: list[str], log_dir: Path, url: str, cpus: CPUs = None) -> Proc:
    """Start ``cmd`` logging to ``log_dir/name.log``; ``cpus``: the cores it may run on (all
    when None), set in the child before it starts."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    env = dict(
        os.environ,
        RAY_AUTH_MODE=os.environ.get("RAY_AUTH_MODE", "disabled"),
        RADIXRAY_CLUSTER_TOKEN=CLUSTER_TOKEN,
    )
    with log.open("w") as f:
        pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        p = subprocess.Popen(
            cmd,
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            preexec_fn=pin,  # noqa: PLW1509 (only sched_setaffinity, no locks taken)
        )
    return Proc(name, url, p, log)


def _spawn_router(
    name: str,
    cmd: list[str],
    log_dir: Path,
    port: int,
    ready_path: str,
    num_workers: int,
    timeout_s: float,
    cpus: CPUs = None,
) -> Proc:
    """Start a router and wait until it reports every worker healthy (stop it if it fails)."""
    proc = _spawn(name, cmd, log_dir, f"http://{LOCAL}:{port}", cpus)
    try:
        wait_ready(proc, ready_path, timeout_s, lambda j: j.get("healthy_workers") == num_workers)
    except BaseException:
        proc.stop()
        raise
    return proc


def wait_ready(proc: Proc, path: str, timeout_s: float, check=None) -> None:
    """Poll ``proc.url + path`` until it answers 200 (and ``check(json)`` holds)."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited ({proc.popen.returncode}):\n{proc.tail()}")
        try:
            r = httpx.get(proc.url + path, timeout=2)
            if r.status_code == 200 and (check is None or check(r.json())):
                return
            last = f"HTTP {r.status_code} {r.text[:200]}"
        except (httpx.HTTPError, ValueError) as e:
            last = f"{type(e).__name__}: {e}"
        time.sleep(0.3)
    raise TimeoutError(f"{proc.name} not ready after {timeout_s}s ({last}):\n{proc.tail()}")


def _radixray(*args: str) -> list[str]:
    return [sys.executable, "-m", "radixray.cli", *args]


def _serve_cmd(port: int, policy: str, *args: str) -> list[str]:
    """``radixray serve`` on ``port`` as the benchmarks run it (no admission limit in the way)."""
    port_args = ("--host", LOCAL, "--port", str(port), "--policy", policy)
    return _radixray("serve", *port_args, "--max-inflight", "4096", *args)


def start_workers(
    n: int,
    base_port: int,
    spec: WorkerSpec,
    log_dir: Path,
    timeout_s: float = 180.0,
    cpus: CPUs = None,
    grpc_ports: tuple[int, ...] = (),
) -> list[Proc]:
    """``grpc_ports``: worker i also serves SGLang's gRPC scheduler service on the i-th (smg's
    event-driven routing: ``grpc://127.0.0.1:PORT``); none by default."""
    procs = []
    try:
        for i in range(n):
            port = base_port + i
            cmd = _radixray(
                "worker", "--host", LOCAL, "--port", str(port), "--worker-id", f"w{i}", *spec.args()
            )
            if i < len(grpc_ports):
                cmd += ["--grpc-port", str(grpc_ports[i])]
            procs.append(_spawn(f"worker-{i}", cmd, log_dir, f"http://{LOCAL}:{port}", cpus))
        for p in procs:
            wait_ready(p, "/health", timeout_s)
    except BaseException:
        for p in procs:
            p.stop()
        raise
    return procs


def start_radixray_router(
    port: int,
    worker_urls: list[str],
    policy: str,
    spec: WorkerSpec,
    log_dir: Path,
    timeout_s: float = 120.0,
    cpus: CPUs = None,
) -> Proc:
    cmd = _serve_cmd(port, policy, "--model", spec.model, "--page-size", str(spec.page_size))
    cmd += ["--worker-urls", *worker_urls]
    name = f"radixray-{policy}"
    return _spawn_router(name, cmd, log_dir, port, "/health", len(worker_urls), timeout_s, cpus)


def start_radixray_ray_router(
    port: int,
    num_workers: int,
    policy: str,
    spec: WorkerSpec,
    log_dir: Path,
    timeout_s: float = 180.0,
) -> Proc:
    """``radixray serve`` as users run it: a local Ray, ``num_workers`` worker actors of
    ``spec``, the router in the driver process (the process this returns)."""
    cmd = _serve_cmd(port, policy, "--workers", str(num_workers), *spec.args())
    return _spawn_router(
        f"radixray-ray-{policy}", cmd, log_dir, port, "/health", num_workers, timeout_s
    )


def start_smg_router(
    port: int,
    worker_urls: list[str],
    policy_spec: str,
    log_dir: Path,
    prometheus_port: int,
    timeout_s: float = 120.0,
    cpus: CPUs = None,
) -> Proc:
    """SGLang's model gateway (PyPI ``smg``), as ``peer_smg.smg_command`` starts it."""
    name = f"smg-{policy_spec.replace(':', '-').replace(',', '-')}"
    cmd = smg_command(port, worker_urls, policy_spec, prometheus_port, timeout_s)
    n = len(worker_urls)
    return _spawn_router(name, cmd, log_dir, port, "/readiness", n, timeout_s, cpus)


def served_name(model: str) -> str:
    if model in ("tiny", "smollm2"):
        return model
    return Path(model).stem if Path(model).is_file() else Path(model).name


def warm(urls: list[str], model: str) -> None:
    """One short request per worker (first-step costs), outside the measured window."""

    async def go():
        async with httpx.AsyncClient(timeout=120) as client:
            for i, u in enumerate(urls):
                body = {"model": model, "prompt": f"warm-up {i} " * 4, "max_tokens": 4}
                await stream_request(client, u, body, RequestResult("warm", 0, 0.0), 120)

    asyncio.run(go())
