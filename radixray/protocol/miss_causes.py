"""Why a prompt token was or was not reused: ``MISS_CAUSES``, the keys of every ``miss`` map on
the wire (``StreamChunk.miss``, ``WorkerCounters.miss_tokens``); they add up to the prompt
length. A new cause is a new key a peer of the last version does not know: a
``PROTOCOL_VERSION`` step (docs/architecture.md, "Versioning")."""

from __future__ import annotations

__all__ = ["MISS_CAUSES"]

#   cached     reused from the prefix cache
#   cold       never seen by this worker
#   evicted    this worker held it once (ghost list) and evicted it
#   page_tail  the unaligned tail, or the page holding the last prompt token (logits need it)
#   in_flight  another running request was computing it at the same time
#   disabled   the cache is a ChunkCache (reuse off)
#   host       loaded back from the worker's host tier
#   window     cached, but the sliding-window layers' pages before it were dropped (swa_radix)
#   state      KV cached, but past the deepest state checkpoint before it (mamba_radix: a
#              model with recurrent-state layers resumes only where its state was saved)
MISS_CAUSES = (
    *("cached", "cold", "evicted", "page_tail", "in_flight", "disabled", "host", "window"),
    "state",
)
