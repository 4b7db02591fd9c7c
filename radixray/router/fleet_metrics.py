"""The fleet's counters on every router's ``/metrics``.

Under Ray Serve, a scrape of ``/metrics`` reaches whichever router replica the proxy picks, so a
replica that reported only its own counters would make every scrape a different, partial
answer. Each router therefore publishes its counters (every ``period_s``) to a key-value store
shared by the fleet: Ray's own (GCS) key-value store under Ray and Serve, no external store.
``/metrics`` then adds ``radixray_fleet_*``: every counter and histogram summed over the routers
whose last snapshot is fresh, and ``radixray_fleet_routers``. The router's own series stay as
they are, labelled with ``router``.

Without Ray (routers in front of ``radixray worker`` processes) there is no shared store:
Prometheus scrapes each router and sums them itself, e.g.
``sum without (instance, router) (rate(radixray_prompt_tokens_total[5m]))``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import defaultdict
from typing import Protocol

from radixray.periodic import Periodic

log = logging.getLogger(__name__)

__all__ = ["FleetMetrics", "KVStore", "RayKVStore"]

_PREFIX = "metrics/"


class KVStore(Protocol):
    """A key-value store the routers of a fleet share (blocking calls: run them in a thread)."""

    def put(self, key: str, value: bytes) -> None: ...

    def items(self, prefix: str) -> dict[str, bytes]: ...


class RayKVStore:
    """Ray's cluster key-value store (in the GCS), in one namespace."""

    def __init__(self, namespace: str = "radixray"):
        from ray.experimental import internal_kv

        self._kv = internal_kv
        self.namespace = namespace

    def put(self, key: str, value: bytes) -> None:
        self._kv._internal_kv_put(key, value, overwrite=True, namespace=self.namespace)

    def items(self, prefix: str) -> dict[str, bytes]:
        keys = self._kv._internal_kv_list(prefix, namespace=self.namespace)
        out = {}
        for k in keys:
            v = self._kv._internal_kv_get(k, namespace=self.namespace)
            if v is not None:
                out[k.decode() if isinstance(k, bytes) else k] = v
        return out


class FleetMetrics:
    def __init__(
        self,
        registry,
        router_id: str,
        store: KVStore,
        period_s: float = 2.0,
        stale_s: float = 30.0,
    ):
        """``registry``: the router's prometheus CollectorRegistry; a snapshot older than
        ``stale_s`` (a router that left) is not counted."""
        self.registry = registry
        self.router_id = router_id
        self.store = store
        self.period_s = period_s
        self.stale_s = stale_s
        # the store may be briefly unreachable: the next period tries again
        self._ticker = Periodic(
            lambda: asyncio.to_thread(self.publish), period_s, "fleet metrics: publishing", log
        )

    def snapshot(self) -> bytes:
        """This router's counters and histograms: ``{"ts", "types", "samples"}`` as JSON."""
        types, samples = {}, []
        for family in self.registry.collect():
            if family.type not in ("counter", "histogram"):
                continue
            types[family.name] = family.type
            for s in family.samples:
                if s.name.endswith("_created"):
                    continue
                samples.append([family.name, s.name, sorted(s.labels.items()), s.value])
        return json.dumps({"ts": time.time(), "types": types, "samples": samples}).encode()

    def publish(self) -> None:
        self.store.put(_PREFIX + self.router_id, self.snapshot())

    def render(self) -> bytes:
        """``radixray_fleet_*``: the sum over fresh snapshots (this router's included)."""
        now = time.time()
        types: dict[str, str] = {}
        sums: dict[tuple, float] = defaultdict(float)
        routers = 0
        for key, raw in self.store.items(_PREFIX).items():
            try:
                snap = json.loads(raw)
            except ValueError:
                log.warning("fleet metrics: unreadable snapshot %s", key)
                continue
            if now - snap.get("ts", 0) > self.stale_s:
                continue
            routers += 1
            types.update(snap["types"])
            for family, name, labels, value in snap["samples"]:
                sums[(family, name, tuple(tuple(kv) for kv in labels))] += value
        lines = [
            "# HELP radixray_fleet_routers Routers whose counters are summed below",
            "# TYPE radixray_fleet_routers gauge",
            f"radixray_fleet_routers {routers}",
        ]
        by_family: dict[str, list] = defaultdict(list)
        for (family, name, labels), value in sorted(sums.items()):
            by_family[family].append((name, labels, value))
        for family, rows in by_family.items():
            fleet = family.replace("radixray_", "radixray_fleet_", 1)
            lines.append(f"# HELP {fleet} {family}, summed over the fleet's routers")
            lines.append(f"# TYPE {fleet} {types.get(family, 'untyped')}")
            for name, labels, value in rows:
                label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
                series = name.replace("radixray_", "radixray_fleet_", 1)
                lines.append(
                    f"{series}{{{label_text}}} {value!r}" if labels else f"{series} {value}"
                )
        return ("\n".join(lines) + "\n").encode()

    def start(self) -> None:
        self._ticker.start()

    async def stop(self) -> None:
        await self._ticker.stop()


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
