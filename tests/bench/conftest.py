"""A real ``radixray worker``-style app (tiny model, one in-process worker) on 127.0.0.1."""

from __future__ import annotations

import pytest

from radixray.router.model_meta import load_model_meta
from radixray.router.service import RouterService, RouterSettings
from radixray.router.worker_client import LocalWorkerClient
from radixray.worker.actor import WorkerHost
from tests.router.serving import LiveServer

PAGE = 16


def start_worker_app(worker_id: str, num_pages: int | None = 512):
    """(server, url, host): the app ``radixray worker`` serves, with its one worker."""
    meta = load_model_meta("tiny")
    service = RouterService(
        meta, RouterSettings(policy="round_robin", page_size=PAGE, poll_interval_s=0.05)
    )
    host = WorkerHost({"model": "tiny", "page_size": PAGE, "num_pages": num_pages}, worker_id)
    server = LiveServer(service, lambda: [LocalWorkerClient(host)])
    url = server.__enter__()
    return server, url, host


@pytest.fixture(scope="session")
def worker_app():
    server, url, host = start_worker_app("w0")
    yield url, host
    server.__exit__(None, None, None)
    host.shutdown()


@pytest.fixture(scope="session")
def second_worker_app():
    server, url, host = start_worker_app("w1")
    yield url, host
    server.__exit__(None, None, None)
    host.shutdown()
