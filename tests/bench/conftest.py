"""A real ``radixray worker`` (tiny model, one engine over HTTP) on 127.0.0.1."""

from __future__ import annotations

import pytest

from tests.router.serving import worker_server


@pytest.fixture(scope="session")
def worker_app():
    server, host = worker_server("w0")
    with server as url:
        yield url, host
    host.shutdown()
