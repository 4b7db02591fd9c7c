"""Real ``radixray worker`` apps (tiny model, page size 16) on 127.0.0.1 for the HTTP tests."""

from __future__ import annotations

import pytest

from tests.router.serving import worker_server

TOKEN = "cluster-secret"


@pytest.fixture(scope="session")
def worker_app():
    """A worker whose internal routes are open (no cluster token): ``(url, host)``."""
    server, host = worker_server("w0")
    with server as url:
        yield url, host
    host.shutdown()


@pytest.fixture(scope="session")
def guarded_worker_app():
    """A worker whose internal routes need ``TOKEN``: ``(url, host)``."""
    server, host = worker_server("w1", token=TOKEN)
    with server as url:
        yield url, host
    host.shutdown()
