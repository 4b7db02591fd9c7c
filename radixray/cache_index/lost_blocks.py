"""How often a block a worker evicts is asked for again, as the router sees it.

A placement that evicts cached tokens costs a recompute for each of them that a later request
needs and finds nowhere. Pricing every evicted token at the share of prompt tokens found cached
overprices it: LRU evicts the coldest tokens, not average ones (on the Mooncake conversation
trace, 1.8% of the tokens a full fleet evicted were ever requested again, where 35% of prompt
tokens were found cached). ``LostBlocks`` measures the rate itself, from what the router's index
already receives:

- a *loss* is a block leaving a worker altogether: a device removal of a block the worker does
  not keep on its host tier, or a host removal of one it does not hold on its device (a
  demotion is stored on the host before it leaves the device, so it is not a loss, nor is a
  load-back, a restart's ``AllBlocksCleared`` or the index's own bound). The index reports each
  (``ApproxIndex.lost``) into a bounded ghost list of hashes, the most recent ``capacity``.
- a *return* is a ghost block a worker stores again on its device while no other worker holds
  it on either tier and it holds no host copy: it was computed again because it was lost. The
  store leaves the ghost either way, so each loss returns at most once. Returns are counted
  from events, which every router of a fleet sees alike, whatever the policy, and only for
  blocks really computed (a refused request's are not).

``rate`` is returns over losses, both counted with the same exponential memory (in lost blocks,
the ghost's capacity), starting from a prior (the caller's reuse share) worth ``prior_blocks``
losses and forgotten at the same pace, so the first requests are priced as before. A return
further back than the ghost's horizon is not seen, on purpose when the horizon is the fleet's
pages (``resize``, both tiers): a block that comes back only after its cache turned over once
would have been evicted by then anyway, had this placement kept it. Known undercount: a host
tier's drop of a block the index still shows on that worker's device because the router sent
it a request that will load it back is not a loss (2.6% of the losses in a simulated tiered
fleet); and an index bounded below a worker's pages can count as lost a demotion whose host entry
it trimmed (the live router's bound, 2^20 blocks a worker, is far above any worker's pages).
"""

from __future__ import annotations

from collections.abc import Sequence

from .ghost import GhostList

__all__ = ["LostBlocks", "MAX_LOST_BLOCKS"]

# The longest horizon ``resize`` sets (~150 MB of hashes, about what the index takes for as many
# entries): a fleet with more pages than this measures over its most recent million losses.
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
        """A new horizon, in lost blocks, at most ``MAX_LOST_BLOCKS`` (the oldest entries beyond
        it go now)."""
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 lost block, got {capacity}")
        capacity = min(capacity, MAX_LOST_BLOCKS)
        if capacity != self.ghost.capacity:
            self.ghost.capacity = capacity
            self.ghost.add(())  # trims to the new capacity

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

    def stored(self, hashes: Sequence[int], owners: dict, host_owners: dict, slot) -> int:
        """A worker (index ``slot``) stored these blocks on its device: count the lost ones that
        nobody else holds (``owners`` / ``host_owners``: hash -> bitmask of workers, before this
        store) as returns, and forget them all. Returns how many were counted."""
        ghost = self.ghost
        if not len(ghost):
            return 0
        back = [h for h in hashes if h in ghost]
        if not back:
            return 0
        ghost.discard(back)
        others = ~(1 << slot) if slot is not None else -1
        n = sum(1 for h in back if not (owners.get(h, 0) & others or h in host_owners))
        self.returns += n
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
