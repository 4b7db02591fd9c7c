import os

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def worker_app():
    """A real ``radixray worker`` app (tiny model, page size 16, internal routes open) on
    127.0.0.1: ``(url, host)``."""
    from tests.router.serving import worker_server

    server, host = worker_server("w0")
    with server as url:
        yield url, host
    host.shutdown()
