"""Bearer tokens: the router's admin token and the cluster token of a worker's internal routes."""

from __future__ import annotations

import hmac

__all__ = ["bearer_matches"]


def bearer_matches(authorization: str | bytes | None, token: str) -> bool:
    """True when an ``Authorization`` header value is ``Bearer <token>`` (constant-time)."""
    if isinstance(authorization, bytes):
        authorization = authorization.decode("latin-1")
    scheme, _, given = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), token.encode())
