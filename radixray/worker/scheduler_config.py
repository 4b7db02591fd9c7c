"""The scheduler's settings (``Scheduler``, worker/scheduler.py; the engine's and the
simulator's defaults are these)."""

from __future__ import annotations

from dataclasses import dataclass

from .packing import PACKINGS, check_packing

__all__ = ["PACKINGS", "PREFILL_ORDERS", "SchedulerConfig", "check_packing", "check_prefill_order"]

PREFILL_ORDERS = ("fcfs", "shortest", "ratio")


def check_prefill_order(order: str) -> None:
    """The one check of a prefill order (SchedulerConfig, EngineConfig, SimConfig)."""
    if order not in PREFILL_ORDERS:
        raise ValueError(f"prefill_order must be one of {', '.join(PREFILL_ORDERS)}, got {order!r}")


@dataclass(frozen=True)
class SchedulerConfig:
    # The defaults of these five are the engine's too (EngineConfig and the CLI take them from
    # here). 1024 tokens per step is what `radixray serve` and `worker` have always run with.
    max_batch_tokens: int = 1024  # tokens computed per step (prefill chunks + decodes)
    max_running: int = 64
    max_wait_steps: int = 32  # a request waiting this many steps is admitted before LPM order
    # Longer waiting queues are served FCFS: ordering matches every waiting prompt each step
    # (~50 us per 4k-token prompt), which past this length costs more than it saves.
    lpm_queue_limit: int = 128
    dedupe_in_flight: bool = True
    # Which prefill work a step's budget goes to after the decodes. "ratio": running prefills and
    # waiting requests together, highest response ratio first, (waited + left) / left, a
    # request's wait read in the tokens the worker computed since it arrived (Brinch Hansen's
    # HRRN, on what is left): a short prompt passes a long prefill within a step (the long one
    # keeps its pages and pauses), and a long one's wait counts for it, so it is not held behind
    # a stream of short ones. "shortest": the same, fewest uncomputed tokens first. "fcfs":
    # running prefills continue first (by arrival), then admissions by longest cached prefix; a
    # long prompt's chunks hold the budget until it is done, and everything behind it waits (as
    # in vLLM and SGLang). In each, what has waited max_wait_steps goes first, by arrival.
    prefill_order: str = "ratio"
    # How full a step that finishes a prompt gets (worker/packing.py). "priced": more prefill
    # rides along only when it saves the prompts waiting more than it delays the finishing ones'
    # first tokens (by the worker's step-cost fits). "full": every step filled to
    # max_batch_tokens, as vLLM and SGLang do.
    packing: str = "priced"
    # State checkpoints (a model with state layers, cache mamba_radix): taken at page ends that
    # are multiples of this and at each prompt's last full page; prefill chunks end there
    # (worker/state_checkpointer.py). EngineConfig.state_interval says why 256.
    state_interval: int = 256

    def __post_init__(self):
        for name in (
            *("max_batch_tokens", "max_running", "max_wait_steps"),
            *("lpm_queue_limit", "state_interval"),
        ):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"SchedulerConfig.{name} must be an int >= 1, got {v!r}")
        check_prefill_order(self.prefill_order)
        check_packing(self.packing)
