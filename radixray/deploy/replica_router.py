"""Addressing one worker replica through Ray Serve: a request router that only pins.

radixray's policy runs in the ingress (``RouterService``: the index fed by the replicas' KV
events, decision records, retries before the first token, the closed loop on actual cached
tokens). Serve's public handle API can only say "some replica of this deployment", so the
worker deployment uses this ``RequestRouter``: every call names its target in the keyword
argument ``replica`` (the replica's ``unique_id``), and ``choose_replicas`` returns exactly that
replica. A replica that is gone fails the call at once with ``ReplicaGone`` (the radixray router
then marks the worker down and retries elsewhere) instead of Serve's default of waiting with
back-off for a replica that will never come back.

Membership comes from the same object: Serve pushes the running replica set to every router
(``update_replicas``), and this class publishes it (``replicas.publish``) for the ingress in the
same process. What the ingress sees as a worker is exactly what this router can address.

Serve pickles this class by value: it refers to shared state only through the ``replicas``
module (imported by reference).
"""

from __future__ import annotations

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from radixray.deploy import replicas

__all__ = ["PinnedReplicaRouter"]


class PinnedReplicaRouter(RequestRouter):
    """Routes each call to the replica its ``replica=`` keyword argument names."""

    def update_replicas(self, running: list[RunningReplica]) -> None:
        super().update_replicas(running)
        self._publish()

    def on_replica_actor_died(self, replica_id) -> None:
        # A call found the actor dead before the controller said so: stop listing it now, so
        # the ingress fails calls to it without routing them.
        super().on_replica_actor_died(replica_id)
        self._publish()

    def _publish(self) -> None:
        dep = self._deployment_id
        replicas.publish(dep.app_name, dep.name, (rid.unique_id for rid in self.curr_replicas))

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        target = (
            None if pending_request is None else pending_request.kwargs.get(replicas.TARGET_KWARG)
        )
        if target is None:
            # Not a pinned call (e.g. a probe by hand): any replica will do.
            return [candidate_replicas]
        # A full replica is skipped by Serve and retried: back off between tries rather than
        # spinning on the router's loop.
        pending_request.routing_context.should_backoff = True
        for r in candidate_replicas:
            if r.replica_id.unique_id == target:
                return [[r]]
        if not pending_request.future.done():
            pending_request.future.set_exception(
                replicas.ReplicaGone(f"worker replica {target!r} is not running")
            )
            # Serve indexes pending requests by internal id and drops the entry only when it
            # fulfills or cancels one; a request failed here would stay indexed for ever.
            # (The same helper FIFOMixin uses; absent in other Ray versions: then skip.)
            forget = getattr(self, "_remove_pending_request_from_indices", None)
            if forget is not None:
                forget(pending_request)
        # Serve's routing loop only checks for a finished request after a non-empty rank: hand
        # it one (never used: the request is already failed) so that the loop ends here.
        return [candidate_replicas[:1]]
