"""SGLang's model gateway (PyPI ``smg``, the Rust router SGLang ships today) as a benchmark peer.

A target ``smg:POLICY[:KEY=VALUE,...]`` starts ``python -m smg.launch_router --policy POLICY`` in
front of the benchmark's workers, each ``KEY=VALUE`` becoming ``--KEY VALUE``: the settings a
sweep varies (``smg:cache_aware:cache-threshold=0.5,max-tree-size=49152``). Only the keys in
:data:`SMG_OPTIONS` are taken, each checked here, so that a typo fails before a run starts and
not as a router that never comes up. What smg needs of a worker, and what it sends, is in
docs/peers/smg.md.
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version

__all__ = ["SMG_OPTIONS", "smg_args", "smg_available", "smg_version", "smg_command"]


def _fraction(key: str, text: str) -> str:
    try:
        x = float(text)
    except ValueError:
        x = -1.0
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"smg option {key} must be a number in [0, 1], got {text!r}")
    return text


def _count(key: str, text: str) -> str:
    if not text.isdigit():
        raise ValueError(f"smg option {key} must be an int >= 0, got {text!r}")
    return text


def _at_least_one(key: str, text: str) -> str:
    try:
        x = float(text)
    except ValueError:
        x = 0.0
    if x < 1.0:
        raise ValueError(f"smg option {key} must be a number >= 1, got {text!r}")
    return text


# What a target may set: cache_aware's match threshold, its spill gate, the text tree's size (in
# characters, shared by all workers) and how often it is trimmed to that size.
SMG_OPTIONS = {
    "cache-threshold": _fraction,
    "balance-abs-threshold": _count,
    "balance-rel-threshold": _at_least_one,
    "max-tree-size": _count,
    "eviction-interval-secs": _count,
}


def smg_args(policy_spec: str) -> list[str]:
    """``cache_aware:cache-threshold=0.5`` -> ``["--policy", "cache_aware",
    "--cache-threshold", "0.5"]``; ValueError naming what is wrong."""
    policy, _, opts = policy_spec.partition(":")
    args = ["--policy", policy]
    for part in opts.split(",") if opts else ():
        key, eq, value = part.partition("=")
        if not eq or key not in SMG_OPTIONS:
            raise ValueError(
                f"smg policy {policy_spec!r}: expected KEY=VALUE with KEY one of "
                f"{sorted(SMG_OPTIONS)}, got {part!r}"
            )
        args += [f"--{key}", SMG_OPTIONS[key](key, value)]
    return args


def smg_version() -> str | None:
    try:
        return version("smg")
    except PackageNotFoundError:
        return None


def smg_available() -> str | None:
    """None when smg is installed here, else why not."""
    if smg_version() is None:
        return "smg is not installed; pip install smg"
    return None


def smg_command(
    port: int,
    worker_urls: list[str],
    policy_spec: str,
    prometheus_port: int,
    timeout_s: float,
) -> list[str]:
    """The command line: the policy's own flags, then the benchmark's (no retries, no circuit
    breaker: every router sees every request once, as ours does). smg's worker overload
    protection stays at its default (on), as a user runs it."""
    return [
        sys.executable,
        "-m",
        "smg.launch_router",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-urls",
        *worker_urls,
        *smg_args(policy_spec),
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(prometheus_port),
        "--log-level",
        "warn",
        "--worker-startup-check-interval",
        "1",
        "--worker-startup-timeout-secs",
        str(int(timeout_s)),
        "--health-check-interval-secs",
        "5",
        "--disable-retries",
        "--disable-circuit-breaker",
        "--shutdown-grace-period-secs",
        "2",
    ]
