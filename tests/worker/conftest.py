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
