"""Configuration of the Ray Serve application: one frozen dataclass per part, built from the
plain dict that ``serve run`` passes as ``args`` (see ``deploy/serve_config.yaml``).

::

    model, served_model_name, policy, page_size    shared by the router and every worker
    engine:   extra EngineConfig fields for each worker (num_pages, cpu_threads, device, ...)
    router:   RouterSettings fields (poll_interval_s, max_inflight, ...) and
              the ingress deployment's sizing (num_replicas, num_cpus, max_ongoing_requests)
    workers:  the worker deployment's sizing: num_replicas or autoscaling_config, num_cpus,
              num_gpus, max_ongoing_requests

The admin token is never part of the config (it would land in the Serve config, in plain text in
the RayService object): the ingress reads ``RADIXRAY_ADMIN_TOKEN`` from its environment, which
the helm chart fills from a Secret. ``admin_token_from_env`` is the one place that reads it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from radixray.router.service import RouterSettings
from radixray.worker.engine_config import EngineConfig

__all__ = [
    "ServeAppConfig",
    "RouterDeploymentConfig",
    "WorkerDeploymentConfig",
    "admin_token_from_env",
    "ADMIN_TOKEN_ENV",
]

ADMIN_TOKEN_ENV = "RADIXRAY_ADMIN_TOKEN"

# Engine fields the app sets itself: model, page size and worker id are the same for all replicas.
_ENGINE_OWNED = ("model", "page_size", "worker_id")


def admin_token_from_env() -> str | None:
    return os.environ.get(ADMIN_TOKEN_ENV) or None


def _nonneg(owner: str, name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{owner}.{name} must be a number >= 0, got {value!r}")


def _positive_int(owner: str, name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}.{name} must be an int >= 1, got {value!r}")


def _build(cls, owner: str, data: Mapping | None):
    """``cls(**data)`` with an error that names the unknown keys and the valid ones."""
    data = dict(data or {})
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{owner}: unknown key(s) {unknown}; valid keys are {sorted(known)}")
    return cls(**data)


def _check_autoscaling(owner: str, a) -> None:
    """Serve's autoscaling_config, which must keep at least one replica."""
    if a is None:
        return
    if not isinstance(a, Mapping):
        raise ValueError(f"{owner}.autoscaling_config must be a mapping, got {a!r}")
    if a.get("min_replicas", 1) < 1:
        raise ValueError(
            f"{owner}.autoscaling_config.min_replicas must be >= 1, got {a['min_replicas']}"
        )


def _replicas(num_replicas: int, autoscaling_config: dict | None) -> dict:
    """Serve's replica options: autoscaling when configured, else a fixed count."""
    if autoscaling_config:
        return {"autoscaling_config": dict(autoscaling_config)}
    return {"num_replicas": num_replicas}


@dataclass(frozen=True)
class WorkerDeploymentConfig:
    """The worker deployment: one engine per replica."""

    num_replicas: int = 2  # ignored when autoscaling_config is set
    autoscaling_config: dict | None = None  # Serve's: min_replicas, max_replicas, ...
    num_cpus: float = 0.5  # fractions let several CPU workers share a core
    num_gpus: float = 0  # 1 on GPU nodes: each replica owns one accelerator
    max_ongoing_requests: int = 256  # the engine batches; the router's own limits come first
    graceful_shutdown_timeout_s: float = 30.0

    def __post_init__(self):
        o = "workers"
        _positive_int(o, "num_replicas", self.num_replicas)
        _positive_int(o, "max_ongoing_requests", self.max_ongoing_requests)
        for name in ("num_cpus", "num_gpus", "graceful_shutdown_timeout_s"):
            _nonneg(o, name, getattr(self, name))
        # Scale-to-zero would leave the router with nothing to route to and no way to wake a
        # worker (requests never reach a worker replica's queue): keep one.
        _check_autoscaling(o, self.autoscaling_config)

    @property
    def initial_replicas(self) -> int:
        """How many replicas Serve starts with (what the router waits for at startup)."""
        a = self.autoscaling_config
        if not a:
            return self.num_replicas
        return a.get("initial_replicas") or a.get("min_replicas") or 1

    def deployment_options(self) -> dict:
        opts: dict = {
            "ray_actor_options": {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus},
            "max_ongoing_requests": self.max_ongoing_requests,
            "graceful_shutdown_timeout_s": self.graceful_shutdown_timeout_s,
            # The router polls every replica a few times a second: one access-log line per poll
            # would drown the log. Errors are still logged.
            "logging_config": {"enable_access_log": False},
        }
        return opts | _replicas(self.num_replicas, self.autoscaling_config)


@dataclass(frozen=True)
class RouterDeploymentConfig:
    """The ingress deployment (the router) and the RouterSettings it runs with."""

    num_replicas: int = 1  # each replica keeps its own index from the same worker events
    # Serve's autoscaling (min_replicas, max_replicas, target_ongoing_requests, ...): replicas
    # added on load join the fleet warm (each reads every worker's snapshot before /health).
    autoscaling_config: dict | None = None
    num_cpus: float = 0  # the router only awaits; on 2 cores a whole CPU per replica hangs
    max_ongoing_requests: int = 1024
    settings: dict = field(default_factory=dict)  # RouterSettings fields except policy/page_size
    startup_wait_s: float = 300.0  # the ingress waits up to this for the initial workers

    def __post_init__(self):
        o = "router"
        _positive_int(o, "num_replicas", self.num_replicas)
        _positive_int(o, "max_ongoing_requests", self.max_ongoing_requests)
        _nonneg(o, "num_cpus", self.num_cpus)
        _nonneg(o, "startup_wait_s", self.startup_wait_s)
        _check_autoscaling(o, self.autoscaling_config)  # no router, no way in
        for owned in ("policy", "page_size", "admin_token"):
            if owned in self.settings:
                where = (
                    f"the {ADMIN_TOKEN_ENV} environment variable"
                    if owned == "admin_token"
                    else f"top-level {owned!r}"
                )
                raise ValueError(f"router.settings.{owned} is not allowed here: use {where}")

    def deployment_options(self) -> dict:
        opts: dict = {
            "ray_actor_options": {"num_cpus": self.num_cpus},
            "max_ongoing_requests": self.max_ongoing_requests,
        }
        return opts | _replicas(self.num_replicas, self.autoscaling_config)


@dataclass(frozen=True)
class ServeAppConfig:
    # The defaults are the engine's and the router's (deploy/helm values.yaml repeats them for
    # helm's users; tests/test_settings.py checks that they agree).
    model: str = EngineConfig.model
    served_model_name: str | None = None
    policy: str = RouterSettings.policy
    page_size: int = EngineConfig.page_size
    engine: dict = field(default_factory=dict)
    router: RouterDeploymentConfig = field(default_factory=RouterDeploymentConfig)
    workers: WorkerDeploymentConfig = field(default_factory=WorkerDeploymentConfig)

    def __post_init__(self):
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"model must be a non-empty string, got {self.model!r}")
        owned = sorted(set(self.engine) & set(_ENGINE_OWNED))
        if owned:
            raise ValueError(f"engine.{owned[0]} is set by the app; use top-level keys instead")
        # Fail at build time, in the driver, rather than in every replica's constructor.
        from radixray.router.policies import make_policy

        make_policy(self.policy)
        RouterSettings(policy=self.policy, page_size=self.page_size, **self.router.settings)
        EngineConfig(**self.engine_config("check"))

    @classmethod
    def from_dict(cls, data: Mapping | None) -> ServeAppConfig:
        data = dict(data or {})
        router = _build(RouterDeploymentConfig, "router", data.pop("router", None))
        workers = _build(WorkerDeploymentConfig, "workers", data.pop("workers", None))
        return _build(cls, "config", {**data, "router": router, "workers": workers})

    def engine_config(self, worker_id: str) -> dict:
        return {**self.engine, "model": self.model, "page_size": self.page_size} | {
            "worker_id": worker_id
        }

    def router_settings(self, router_id: str | None = None) -> RouterSettings:
        return RouterSettings(
            policy=self.policy,
            page_size=self.page_size,
            admin_token=admin_token_from_env(),
            router_id=router_id,
            **self.router.settings,
        )
