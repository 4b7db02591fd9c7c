"""The OpenAI edge under test: the official client against a router and against a worker's own
server (each test module gets its own pair, started once)."""

import openai
import pytest

from radixray.api import OpenAIApp, install_openai

from ..router.serving import LiveApp, served
from .scripted import ANSWER, ScriptedBackend


@pytest.fixture(scope="module", params=["router", "worker"])
def client(request):
    with served(request.param) as (url, _):
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def scripted():
    backend = ScriptedBackend(ANSWER)
    app = OpenAIApp()
    install_openai(app, backend)
    with LiveApp(app) as url:
        yield backend, openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60)
