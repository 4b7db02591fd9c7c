"""Fleet metrics through Ray's own key-value store: every router's /metrics shows the counters
of all the fleet's routers summed (a scrape through Serve's proxy reaches any one of them)."""

from __future__ import annotations

import asyncio
import os
import tempfile

import pytest
from prometheus_client.parser import text_string_to_metric_families

from radixray.protocol import GenerateRequest, SamplingParams
from radixray.router.fleet_metrics import RayKVStore

from .fleet import drain, fleet, hosts_for

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.integration  # Ray


@pytest.fixture(scope="module")
def local_ray():
    os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="rr-fm-"))
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _families(text: bytes) -> dict:
    out = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_every_router_shows_the_fleet_sum(local_ray):
    hosts = hosts_for(2)
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)

    async def go():
        async with fleet(hosts, 2, policy="round_robin") as (a, b):
            for s in (a, b):
                s.share_metrics(RayKVStore(namespace="radixray-test-fleet"))
            for i, (s, n) in enumerate(((a, 3), (b, 5))):
                for k in range(n):
                    req = GenerateRequest(f"fm-{i}-{k}", [5, 6, 7, 8 + k], params)
                    await drain(await s.open(req, None))
            for s in (a, b):
                await asyncio.to_thread(s.fleet_metrics.publish)
            return await a.render_metrics(), await b.render_metrics()

    try:
        text_a, text_b = asyncio.run(go())
    finally:
        for h in hosts:
            h.shutdown()
    fa, fb = _families(text_a), _families(text_b)
    assert fa[("radixray_fleet_routers", ())] == fb[("radixray_fleet_routers", ())] == 2
    # Each router's own counters, and the fleet's: 3 + 5 decisions, 4 prompt tokens each.
    own_a = sum(v for (n, _), v in fa.items() if n == "radixray_decisions_total")
    own_b = sum(v for (n, _), v in fb.items() if n == "radixray_decisions_total")
    fleet_a = sum(v for (n, _), v in fa.items() if n == "radixray_fleet_decisions_total")
    fleet_b = sum(v for (n, _), v in fb.items() if n == "radixray_fleet_decisions_total")
    assert (own_a, own_b) == (3, 5) and fleet_a == fleet_b == 8
    assert fa[("radixray_fleet_completion_tokens_total", ())] == 16
    assert fa[("radixray_fleet_ttft_seconds_count", ())] == 8
    assert fa[("radixray_router_info", (("router", "r0"),))] == 1
