"""Property-based API testing: schemathesis generates requests from the app's own OpenAPI
schema and sends them to the live router over HTTP. Zero 5xx is the bar.

(Driven through schemathesis' programmatic API and hypothesis directly: its pytest plugin does
not load under this pytest version.)"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from .serving import LiveServer, inprocess_service

pytestmark = pytest.mark.integration  # schemathesis

EXAMPLES_PER_OPERATION = 25


def _fuzz(op, url: str, statuses: set[int]) -> None:
    @given(case=op.as_strategy())
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def check(case):
        if isinstance(case.body, dict) and "model" in case.body:
            # A free-form model string is a 404 almost always; aim at the served model so the
            # generated bodies also exercise the serving path.
            case.body["model"] = "tiny"
        response = case.call(base_url=url, timeout=60)
        statuses.add(response.status_code)
        assert response.status_code < 500, (op.path, response.status_code, response.text[:300])

    check()


def test_no_server_errors():
    # Small generation limits keep each valid request fast on the tiny model.
    service, hosts, clients = inprocess_service(2, max_tokens_limit=8, admin_token="t0ken")
    seen: dict[str, set[int]] = {}
    with LiveServer(service, clients) as url:
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
        operations = [r.ok() for r in schema.get_all_operations()]
        assert len(operations) >= 9  # completions, chat, models, health, metrics, debug, admin
        for op in operations:
            _fuzz(op, url, seen.setdefault(f"{op.method.upper()} {op.path}", set()))
    for h in hosts:
        h.engine.check_integrity()
        assert h.engine.cache.protected_tokens == 0
        h.shutdown()
    # The generator reached both sides of the endpoints that do work: rejected bodies, and
    # bodies valid enough to be served.
    served = seen["POST /v1/completions"] | seen["POST /v1/chat/completions"]
    assert 200 in served and 400 in served, seen
