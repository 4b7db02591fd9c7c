"""A ``radixray worker`` app behind a cluster token (the open one: tests/conftest.py)."""

from __future__ import annotations

import pytest

from tests.router.serving import worker_server

TOKEN = "cluster-secret"


@pytest.fixture(scope="session")
def guarded_worker_app():
    """A worker whose internal routes need ``TOKEN``: ``(url, host)``."""
    server, host = worker_server("w1", token=TOKEN)
    with server as url:
        yield url, host
    host.shutdown()


@pytest.fixture(scope="session")
def smollm2_loaded():
    """The real SmolLM2 as an ``Engine`` loads it (``EngineConfig(model="smollm2")``: float32 on
    the CPU), once per test process; engines built with ``loaded=`` share it (~1-2 s a load).
    Loaded on one thread: on a small shared CPU two OpenMP threads spin against the other
    processes."""
    import torch

    from radixray.worker import EngineConfig
    from radixray.worker.model_runner import load_for_engine

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return load_for_engine(EngineConfig(model="smollm2"), torch.device("cpu"))
    finally:
        torch.set_num_threads(previous)
