"""How often a block a worker evicts is asked for again, as the router sees it.

A placement that evicts cached tokens costs a recompute for each of them that a later request
needs and finds nowhere. Pricing every evicted token at the share of prompt tokens found cached
overprices it: LRU evicts the coldest tokens, not average ones (on the Mooncake conversation
trace, 1.8% of the tokens a full fleet evicted were ever requested again, where 35% of prompt
tokens were found cached). ``LostBlocks`` measures the rate itself, from what the router's index
already receives:

- a *loss* is a block leaving a worker altogether (a device removal the worker does not keep on
  its host tier, or a host removal it does not hold on its device: a demotion or a load-back is
  not a loss). The index reports each one (``ApproxIndex.lost``); it goes into a bounded ghost
  list of hashes, the most recent ``capacity`` of them.
- a *return* is a ghost block a request asks for beyond the longest prefix any worker still
  holds: it is recomputed because it was lost. Each counts once (it leaves the ghost).

``rate`` is returns over losses, both counted with the same exponential memory (in lost blocks,
the ghost's capacity), starting from a prior (the caller's reuse share) worth ``prior_blocks``
losses and forgotten at the same pace, so the first requests are priced as before. A return
further back than the ghost's horizon is not seen, on purpose when the horizon is the fleet's
device pages (``resize``): a block that comes back only after its cache turned over once would
have been evicted by then anyway, had this placement kept it.
"""

from __future__ import annotations

from collections.abc import Sequence

from .ghost import GhostList

__all__ = ["LostBlocks", "MAX_LOST_BLOCKS"]

# The longest horizon ``resize`` sets (~100 MB of hashes): a fleet with more device pages than
# this measures the rate over its most recent million lost blocks.
MAX_LOST_BLOCKS = 1 << 20


class LostBlocks:
    def __init__(self, capacity: int = 1 << 16, prior_blocks: float = 1024.0):
        """``capacity``: the ghost list's length and the counts' memory, in lost blocks;
        ``prior_blocks``: how many losses the prior rate is worth."""
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 lost block, got {capacity}")
        if prior_blocks <= 0:
            raise ValueError(f"prior_blocks must be > 0, got {prior_blocks}")
        self.ghost = GhostList(capacity)
        self.prior_weight = float(prior_blocks)  # decays as the counts do
        self.losses = 0.0  # decayed counts
        self.returns = 0.0
        self.total_losses = 0  # plain counts, for metrics
        self.total_returns = 0

    @property
    def capacity(self) -> int:
        return self.ghost.capacity

    def resize(self, capacity: int) -> None:
        """A new horizon, in lost blocks, at most ``MAX_LOST_BLOCKS`` (the oldest entries go at
        the next loss)."""
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 lost block, got {capacity}")
        self.ghost.capacity = min(capacity, MAX_LOST_BLOCKS)

    def lost(self, hashes: Sequence[int]) -> None:
        """Blocks that left a worker altogether."""
        k = len(hashes)
        if not k:
            return
        # k losses one after another, each keeping 1 - 1/capacity of the counts before it
        keep = (1.0 - 1.0 / self.ghost.capacity) ** k
        self.losses = self.losses * keep + self.ghost.capacity * (1.0 - keep)
        self.returns *= keep
        self.prior_weight *= keep
        self.total_losses += k
        self.ghost.add(hashes)

    def returned(self, hashes: Sequence[int], weight: float = 1.0) -> int:
        """A request's blocks past the longest prefix any worker holds: count (and forget) the
        leading ones that were lost, each as ``weight`` returns (a router that sees a share of
        the requests and every loss). Returns how many."""
        ghost = self.ghost
        n = ghost.leading_hits(hashes) if len(ghost) else 0
        if n:
            ghost.discard(hashes[:n])
            self.returns += n * weight
            self.total_returns += n
        return n

    def rate(self, prior: float) -> float:
        """The share of lost blocks asked for again, ``prior`` before enough losses were seen."""
        k = self.prior_weight
        return min(1.0, (self.returns + prior * k) / (self.losses + k))

    def memory_bytes(self) -> int:
        return self.ghost.memory_bytes()

    def stats(self) -> dict:
        return {
            "lost_blocks": self.total_losses,
            "returned_blocks": self.total_returns,
            "ghost_blocks": len(self.ghost),
        }
