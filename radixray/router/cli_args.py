"""The router's command-line flags (``radixray serve``) and the ``RouterSettings`` they make."""

from __future__ import annotations

import argparse
import os
import socket

from radixray.api.response_store import ResponseStoreConfig
from radixray.settings import add_arguments, from_args

from .policies.ttft_config import TTFTConfig, with_settings
from .service import RouterSettings

__all__ = ["add_router_arguments", "router_settings"]


def add_router_arguments(p: argparse.ArgumentParser) -> None:
    """The router's flags of ``radixray serve``."""
    p.add_argument("--policy", default=RouterSettings.policy)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--admin-token",
        default=os.environ.get("RADIXRAY_ADMIN_TOKEN"),
        help="bearer token for /admin (default $RADIXRAY_ADMIN_TOKEN; unset = off)",
    )
    p.add_argument("--no-debug", action="store_true", help="turn the /debug routes off")
    p.add_argument("--max-inflight", type=int, default=RouterSettings.max_inflight)
    p.add_argument(
        "--max-queue-s",
        type=_seconds_or_off,
        default=RouterSettings.max_queue_s,
        help="refuse (429) a request that would wait longer than this many seconds before its "
        "prefill on the least-queued worker; 0 = no limit (default %(default)s)",
    )
    add_arguments(p, ResponseStoreConfig)
    add_arguments(p.add_argument_group("the ttft policy (TTFTConfig)"), TTFTConfig)


def _seconds_or_off(text: str) -> float:
    """A number of seconds >= 0 (0: off), for argparse."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds >= 0 (0 = no limit), got {text!r}")
    return value


def router_settings(args, policy: str) -> RouterSettings:
    """The RouterSettings the flags describe."""
    return RouterSettings(
        policy=with_settings(policy, from_args(TTFTConfig, args)),
        page_size=args.page_size,
        admin_token=args.admin_token,
        enable_debug=not args.no_debug,
        max_inflight=args.max_inflight,
        max_queue_s=args.max_queue_s or None,
        router_id=f"{socket.gethostname()}:{args.port}",
        responses=from_args(ResponseStoreConfig, args),
    )
