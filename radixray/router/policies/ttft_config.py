"""ttft's settings, one dataclass (``TTFTConfig``): the ``--ttft-*`` flags of ``radixray serve``
and ``radixray sim`` are generated from it, and a policy spec (``ttft:margin=0.1``) sets the same
fields. What each one does: docs/ttft_policy.md."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from radixray.settings import setting

__all__ = ["TTFTConfig", "with_settings"]


@dataclass(frozen=True)
class TTFTConfig:
    """ttft's settings (``radixray serve`` and ``radixray sim`` flags ``--ttft-*``; a policy spec
    ``ttft:margin=0.1`` sets them too)."""

    reuse_weight: float | None = setting(
        None,
        "seconds of others' delay charged per second of a prefix recomputed off its holder "
        "(none: measured from the fleet's load; 0: the request's own TTFT alone)",
        flag="--ttft-reuse-weight",
        type=float,
    )
    memory: int = setting(64, "arrivals the load and reuse estimates average over",
                          flag="--ttft-memory")  # fmt: skip
    min_match: float = setting(
        0.01, "a cached prefix under this share of the prompt counts as none",
        flag="--ttft-min-match",
    )  # fmt: skip
    margin: float = setting(
        0.2,
        "a move off the longest prefix's holder must save more than this share of the holder's "
        "cost, unless the prefix is asked for more often than its holders serve (0: off)",
        flag="--ttft-margin",
    )
    shared_share: float = setting(
        0.25,
        "an idle worker counts as held the prefix that this share of the workers hold",
        flag="--ttft-shared-share",
    )
    tiers: bool = setting(
        True, "price host-tier copies at their load-back (off: the tier-blind rule)",
        flag="--ttft-tiers",
    )  # fmt: skip

    def __post_init__(self):
        """ValueError naming the first setting out of its range."""
        if self.reuse_weight is not None and self.reuse_weight < 0:
            raise ValueError(f"reuse_weight must be >= 0 or None, got {self.reuse_weight}")
        if self.memory < 2:
            raise ValueError(f"memory must be >= 2 arrivals, got {self.memory}")
        for name, low, high in (("min_match", 0, 1), ("margin", 0, 1)):
            if not low <= getattr(self, name) < high:
                raise ValueError(f"{name} must be in [{low}, {high}), got {getattr(self, name)}")
        if not 0 < self.shared_share < 1:
            raise ValueError(f"shared_share must be in (0, 1), got {self.shared_share}")

    def spec(self) -> str:
        """The policy spec these settings make: ``ttft`` and each one off its default."""
        default = TTFTConfig()
        changed = [f"{k}={v}" for k, v in asdict(self).items() if getattr(default, k) != v]
        return ":".join(["ttft", *changed])


def with_settings(policy: str, config: TTFTConfig) -> str:
    """``policy`` (a spec) with the settings of ``config`` that are off their defaults, if it
    is ttft; the spec's own arguments win over them (``ttft:margin=0`` over ``--ttft-margin``)."""
    base, *own = policy.split(":")
    return ":".join([base, *config.spec().split(":")[1:], *own]) if base == "ttft" else policy
