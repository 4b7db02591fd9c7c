"""``radixray serve`` on Ray: worker actors named in one namespace (so that a second router,
``--join``, finds them), one cluster token for their internal routes kept in Ray's key-value
store, and the router's client for each actor."""

from __future__ import annotations

__all__ = ["ACTOR_PREFIX", "NAMESPACE", "actor_client", "cluster_token", "named_workers"]

NAMESPACE = "radixray"
ACTOR_PREFIX = "radixray-"  # worker actors are named radixray-<worker id>


def named_workers() -> dict:
    """``{worker id: actor handle}`` of every running radixray worker actor in the namespace
    (for --join)."""
    import ray

    names = sorted(
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith(ACTOR_PREFIX) and a["namespace"] == NAMESPACE
    )
    if not names:
        raise SystemExit(
            f"--join: no worker actors named {ACTOR_PREFIX}* in namespace {NAMESPACE!r}"
        )
    return {n[len(ACTOR_PREFIX) :]: ray.get_actor(n, namespace=NAMESPACE) for n in names}


TOKEN_KEY = b"cluster_token"


def cluster_token(given: str | None) -> str:
    """The token of the worker actors' internal routes: given, or the one the cluster's first
    router stored in Ray's key-value store (a joining router finds it there), or a new one."""
    import secrets

    from ray.experimental import internal_kv

    if given:
        return given
    # Put-if-absent, then read: two routers starting at once agree on one token.
    internal_kv._internal_kv_put(
        TOKEN_KEY, secrets.token_urlsafe(32).encode(), overwrite=False, namespace=NAMESPACE
    )
    return internal_kv._internal_kv_get(TOKEN_KEY, namespace=NAMESPACE).decode()


async def actor_client(handle, worker_id: str, transport: str, token: str, owned: bool):
    """The router's client for one worker actor: over the actor's own HTTP server ("http",
    the default: Ray places and runs it, requests go over HTTP) or through actor calls
    ("ray"). ``owned``: closing the client kills the actor."""
    from radixray.protocol import RayHttpTransport, RayTransport, WorkerClient

    if transport == "ray":
        return WorkerClient(RayTransport(handle, kill_on_close=owned), worker_id)
    url = await handle.start_http.remote(None, 0, token)
    return WorkerClient(RayHttpTransport(handle, url, token, kill_on_close=owned), worker_id)
