import os
import sys

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# These machines set PYTHONDONTWRITEBYTECODE=1 (see the Makefile), so every test process (each
# xdist worker too) compiled radixray and rewrote and compiled every test module again: about
# half of a worker's collection. Caches are gitignored and read back only while the source is
# unchanged: write them.
sys.dont_write_bytecode = False


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# Modules whose tests share fixtures that take seconds to build once per process (gguf's reader
# of the SmolLM2 file and transformers' tokenizer on it; SmolLM2 itself, loaded once for the
# model's and the engines' tests) run first and together, each module whole and in its own
# order: xdist's load scheduler hands the first few hundred tests to one worker, so that worker
# alone builds them (and the longest tests start first). Every worker orders them alike, as
# xdist requires. The modules that import transformers' models or tokenizers follow them, for
# the same reason: that import is 3-4 s of CPU in each process that makes it (it scans every
# model's source), and with these on the first worker the other never makes it. Together they
# must stay within that first hand (a quarter of a worker's share: ~260 tests today, ~210 here).
SHARED_FIXTURE_MODULES = (
    "tests/model_meta/test_gguf_reader.py",
    "tests/model_meta/test_tokenizer.py",
    "tests/worker/test_engine_smollm2.py",
    "tests/worker/test_logprobs_smollm2.py",
    "tests/worker/model/test_smollm2.py",
    # transformers' models or tokenizers: the references of these tests
    "tests/worker/model/test_model_families.py",
    "tests/worker/model/test_llama.py",
    "tests/worker/model/test_loader.py",
    "tests/worker/model/test_gguf_families.py",
    "tests/worker/model/test_checkpoint_declarations.py",
    "tests/worker/model/test_hybrid_families.py",
    "tests/worker/test_hybrid_engine.py",
    "tests/model_meta/test_hf_hybrid.py",
    "tests/model_meta/test_chat_template_tools.py",
    "tests/kernels/test_state_reference.py",
    "tests/kernels/test_window.py",
)


def _first_together(items: list) -> None:
    rank = {name: i for i, name in enumerate(SHARED_FIXTURE_MODULES)}
    first = [it for it in items if it.nodeid.split("::")[0] in rank]
    first.sort(key=lambda it: rank[it.nodeid.split("::")[0]])  # stable: each module's own order
    items[:] = first + [it for it in items if it.nodeid.split("::")[0] not in rank]


@pytest.hookimpl(wrapper=True)
def pytest_cmdline_main(config):
    """An xdist worker, once its session is over and reported, leaves at once: the controller
    waits for each worker process to end, and a worker's own ending (joining the threads the
    tests left, then tearing down torch, transformers and every model and tensor still
    referenced) took 3-9 s of the suite's wall time. Every result, the session's fixtures'
    teardowns and pytest's own cleanups are done and sent by then (``workerfinished`` is sent
    at session finish, and the controller takes the worker as down from that message)."""
    status = yield
    if hasattr(config, "workerinput"):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(status))
    return status


def pytest_collection_modifyitems(config, items):
    _first_together(items)
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
