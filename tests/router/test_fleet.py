"""A fleet of routers over the same real workers routes as one: routers learn of each other
through the workers, a burst split across them does not herd, a router that joins late is warm
before it reports ready, and the herding alarm fires on a herd and only then."""

from __future__ import annotations

import asyncio
import collections
import random

from radixray.protocol import GenerateRequest, SamplingParams

from .fleet import drain, fleet, hosts_for, until

PARAMS = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)


def cold(rng: random.Random, n: int = 160) -> list[int]:
    return [rng.randrange(3, 250) for _ in range(n)]


def test_routers_learn_of_each_other_through_the_workers():
    hosts = hosts_for(2)

    async def go():
        async with fleet(hosts, 3) as services:
            await until(lambda: all(len(s.pool.fleet) == 3 for s in services), what="fleet")
            return [s.pool.fleet for s in services], [s.pool.fleet_position() for s in services]

    try:
        fleets, positions = asyncio.run(go())
    finally:
        for h in hosts:
            h.shutdown()
    assert fleets == [("r0", "r1", "r2")] * 3
    assert positions == [(0, 3), (1, 3), (2, 3)]


async def _one_each(services, rng, tag: str) -> list[str]:
    """One cold request per router, all at once (before any report can show them), once every
    router's reports show the workers idle again."""
    for s in services:
        await s.pool.poll_once()

    async def one(i, s):
        req = GenerateRequest(f"{tag}-{i}", cold(rng), PARAMS)
        return await drain(await s.open(req, None))

    return list(await asyncio.gather(*(one(i, s) for i, s in enumerate(services))))


def test_a_burst_split_across_routers_starts_on_distinct_workers():
    # Three routers see the same three idle workers and each gets one request at the same
    # moment. Unaware of each other (and seeded alike, as replicas of one config are), each
    # takes the same "best" worker; aware (ranks from the workers' reports), each starts on
    # another one.
    hosts = hosts_for(3)

    async def go():
        async with fleet(hosts, 3, policy="ttft") as services:
            await until(lambda: all(len(s.pool.fleet) == 3 for s in services), what="fleet")
            rng = random.Random(0)
            aware = [await _one_each(services, rng, f"aware{k}") for k in range(3)]
            for s in services:  # blind: every router believes it is alone
                s.pool.fleet_position = lambda: (0, 1)
            blind = [await _one_each(services, rng, f"blind{k}") for k in range(3)]
            return aware, blind

    try:
        aware, blind = asyncio.run(go())
    finally:
        for h in hosts:
            h.shutdown()
    assert all(sorted(burst) == ["w0", "w1", "w2"] for burst in aware), aware
    assert any(len(set(burst)) < 3 for burst in blind), blind  # the herd the ranks prevent


def _max_share(workers: list[str]) -> float:
    return max(collections.Counter(workers).values()) / len(workers)


def test_a_shared_prefix_burst_spreads_no_worse_than_with_one_router():
    hosts = hosts_for(4)
    prefix = [(j * 11) % 250 + 3 for j in range(320)]

    async def burst(n_routers: int, tag: str) -> list[str]:
        async with fleet(hosts, n_routers, policy="ttft") as services:
            await until(lambda: all(len(s.pool.fleet) >= n_routers for s in services))

            async def one(i):
                ids = [n_routers + 3] + prefix + [i % 200 + 3, 7]
                s = services[i % n_routers]
                return await drain(await s.open(GenerateRequest(f"{tag}-{i}", ids, PARAMS), None))

            return list(await asyncio.gather(*(one(i) for i in range(24))))

    try:
        shares = {n: _max_share(asyncio.run(burst(n, f"p{n}"))) for n in (1, 2, 3)}
    finally:
        for h in hosts:
            h.shutdown()
    assert shares[2] <= shares[1] and shares[3] <= shares[1], shares


def _digests(service) -> dict[str, str]:
    from radixray.router.routes_ops import _digest

    return {w: _digest(service.index.blocks(w)) for w in service.pool.workers}


def test_a_router_joining_late_is_warm_before_it_reports_ready():
    from radixray.model_meta import load_model_meta
    from radixray.router.service import RouterService, RouterSettings

    from .fleet import join

    hosts = hosts_for(2)

    async def go():
        # round_robin, so both workers fill: cold prompts one at a time on idle workers would all
        # go to the first worker under cache_aware (least-load fallback, ties to the first), and
        # whether a stale polled load sends one elsewhere is timing
        async with fleet(hosts, 2, policy="round_robin") as services:
            rng = random.Random(1)
            for i in range(12):  # traffic through the first two: the workers fill their caches
                req = GenerateRequest(f"warm-{i}", cold(rng, 64 + 16 * i), PARAMS)
                await drain(await services[i % 2].open(req, None))
            late = RouterService(
                load_model_meta("tiny"), RouterSettings(page_size=16, router_id="late")
            )
            before = late.health()
            await join(late, hosts)
            ready, body = late.health()
            for s in services:  # the others catch up with the last events
                await s.pool.poll_once()
            try:
                return before, ready, body, _digests(late), [_digests(s) for s in services]
            finally:
                await late.stop()

    try:
        before, ready, body, late_digests, others = asyncio.run(go())
    finally:
        for h in hosts:
            h.shutdown()
    assert before[0] is False and before[1]["status"] == "unavailable"
    assert ready and body["status"] == "ok" and body["router_id"] == "late"
    assert all(d == late_digests for d in others), (late_digests, others)
    assert all(not d.startswith("0:") for d in late_digests.values())  # not an empty index


async def _sequential(service, n: int, session_key: str | None, tag: str) -> list[str]:
    rng = random.Random(tag)
    out = []
    for i in range(n):
        req = GenerateRequest(f"{tag}-{i}", cold(rng, 40), PARAMS)
        out.append(await drain(await service.open(req, session_key)))
    return out


def test_the_herding_alarm_fires_on_a_herd_and_stays_quiet_otherwise(caplog):
    from radixray.model_meta import load_model_meta
    from radixray.router.service import RouterService, RouterSettings

    from .fleet import join

    hosts = hosts_for(3)

    async def service(policy: str) -> RouterService:
        s = RouterService(
            load_model_meta("tiny"),
            RouterSettings(page_size=16, policy=policy, herd_window=16, router_id=policy),
        )
        await join(s, hosts)
        return s

    async def go():
        herding = await service("least_load")
        balanced = await service("round_robin")
        try:
            # A herd: with one request at a time every worker is idle at each decision, and
            # least_load (SGLang's rule: the first of the least loaded) takes the first each
            # time while the other two sit idle.
            ch = await _sequential(herding, 24, None, "ll")
            alarm = herding.router.dispatch.herd
            episodes, active = alarm.episodes, {w: dict(e) for w, e in alarm.active.items()}
            herding.metrics.refresh_herding(alarm, herding.pool.workers)
            text = herding.metrics.render().decode()
            # Traffic spread again: the episode ends.
            herding.policy = herding.router.policy = balanced.policy
            await _sequential(herding, 16, None, "after")
            after = (alarm.episodes, dict(alarm.active))
            # Balanced: round robin over three workers (after the herd: no stale load from it).
            # The workers are idle again, and the balanced router's reports say so (polled
            # now, not after a wait that a slow machine may outlast).
            await until(lambda: all(h.engine.stats()["running"] == 0 for h in hosts), what="idle")
            await balanced.pool.poll_once()
            rr = await _sequential(balanced, 48, None, "rr")
            quiet = (
                balanced.router.dispatch.herd.episodes,
                dict(balanced.router.dispatch.herd.active),
            )
            return rr, quiet, ch, episodes, active, text, after
        finally:
            await balanced.stop()
            await herding.stop()

    try:
        with caplog.at_level("WARNING", logger="radixray.router.herding"):
            rr, quiet, ch, episodes, active, text, after = asyncio.run(go())
    finally:
        for h in hosts:
            h.shutdown()
    assert collections.Counter(rr) == {"w0": 16, "w1": 16, "w2": 16}
    assert quiet == (0, {})
    (home,) = set(ch)
    assert episodes == 1 and set(active) == {home}
    episode = active[home]
    assert episode["share"] == 1.0 and episode["capacity_share"] == round(1 / 3, 3)
    assert episode["idle_workers"] == sorted({"w0", "w1", "w2"} - {home})
    assert [d["worker_id"] for d in episode["decisions"]] == [home] * 8
    assert all(d["reason"] == "least_load" for d in episode["decisions"])
    assert caplog.text.count("decisions went to worker") == 1
    assert f"herding: 100% of the last 16 decisions went to worker {home}" in caplog.text
    assert episode["decisions"][-1]["request_id"] in caplog.text  # the records that show it
    assert f'radixray_herding{{worker="{home}"}} 1.0' in text
    assert "radixray_herding_episodes_total 1.0" in text
    assert after == (1, {})
