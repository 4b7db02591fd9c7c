"""How much more prefill a step may take once it finishes a prompt ("priced" packing).

A chunked-prefill engine fills every step to its token budget: when a prompt's last chunk leaves
room, the next prompt's first chunk rides along. That saves the requests behind one step's fixed
cost, and it makes the prompt that finishes wait for the other's tokens: on the CPU preset a
91-token last chunk packed with 420 tokens of the next prompt gives its first token after a
0.98 s step instead of a 0.2 s one, to save the next prompt 30 ms.

The rule prices both sides with the worker's own step-cost fits. Each prefill token added to a
step that already finishes ``f`` prompts delays those ``f`` first tokens by its time, ``token_s``;
leaving them out costs the prompts still waiting, in two ways:

- a candidate that would finish in this step (its remaining tokens fit) instead finishes at the
  end of the next one: it waits that step's fixed cost, ``fixed_s`` (the fit's overhead, or a
  decode step of this step's batch, whichever is more: ``step_cost.step_fixed_s``), and the
  tokens queued behind it that share the step (up to its budget). It goes in when
  ``f * n * token_s`` is at most that;
- a chunk that does not finish its prompt moves work one step earlier, which saves the ``m``
  prompts waiting a step's fixed cost only when it moves their last step's boundary: ``k / B`` of
  a step each on average for ``k`` tokens of a ``B``-token step. It goes in when ``f * B *
  token_s <= m * fixed_s``: on the CPU preset (0.95 s of tokens a full step, 30 ms fixed) a
  queue of 32 prompts per finishing one.

So a lone long prompt behind a finishing one waits for a short step, a short prompt behind it
rides along when what is queued would make its next step long, and a deep queue still fills the
step, so throughput near saturation is what full packing gives (the rule costs at most one
step's fixed cost per prompt). Before the worker's fit separates a step's fixed cost from its
tokens, nothing is capped. ``SchedulerConfig.packing = "full"`` is the rule before: every step
filled to its budget, as vLLM's and SGLang's schedulers do.

Decoding sequences are left out on both sides: a packed token delays their next token in this
step as it delays a finishing prompt's, and a step left short gives them their next token
sooner; that is the chunk budget's trade, set by ``max_batch_tokens``.
"""

from __future__ import annotations

from collections.abc import Callable

from radixray.step_cost import StepCostModel, fit_line, step_fixed_s

__all__ = ["PACKINGS", "StepPacking", "check_packing", "fitted_step_costs"]

PACKINGS = ("priced", "full")

# (decoding sequences in the step) -> (fixed_s, token_s), or None while unknown
StepCosts = Callable[[int], "tuple[float, float] | None"]


def check_packing(packing: str) -> None:
    """The one check of a packing rule (SchedulerConfig, EngineConfig, SimConfig)."""
    if packing not in PACKINGS:
        raise ValueError(f"packing must be one of {', '.join(PACKINGS)}, got {packing!r}")


def fitted_step_costs(
    prefill: StepCostModel, decode: StepCostModel, decodes: int
) -> tuple[float, float] | None:
    """``(fixed_s, token_s)`` from a worker's fits (the engine's ``EngineStats`` and the
    simulator's workers keep the same two): the fixed cost of one more step with ``decodes``
    sequences decoding, and the seconds of one more prefill token. None until the prefill steps
    timed tell a step's fixed cost from its tokens' (steps of one size only, at start)."""
    fit = fit_line(prefill.moments)  # not the plain ratio: that has no fixed cost to weigh
    if fit is None:
        return None
    overhead_s, tokens_per_s = fit
    decode_step_s = 0.0
    if decodes:
        line = fit_line(decode.moments)  # (a decode step's fixed s, sequences per s)
        if line is not None:
            decode_step_s = line[0] + decodes / line[1]
    return step_fixed_s(overhead_s, decodes, decode_step_s), 1.0 / tokens_per_s


class StepPacking:
    """One step's account under the priced rule: the prompts it finishes and its decodes.
    ``costs`` None: nothing is capped (``packing="full"``, or costs not known yet)."""

    __slots__ = ("_costs", "_step_tokens", "_decodes", "_price", "finishing")

    def __init__(self, costs: StepCosts | None, step_tokens: int = 0):
        self._costs = costs
        self._step_tokens = step_tokens  # the step's token budget (max_batch_tokens)
        self._decodes = 0
        self._price: tuple[float, float] | None = None
        self.finishing = 0

    def note(self, decode: bool, finishes: bool) -> None:
        """A scheduled item: a decode, or a prefill chunk that may finish its prompt."""
        if decode:
            self._decodes += 1
        elif finishes:
            if not self.finishing and self._costs is not None:
                self._price = self._costs(self._decodes)  # decodes are scheduled first
            self.finishing += 1

    def limit(self, budget: int, remaining: int, waiting: int, behind: int) -> int:
        """What of ``budget`` the next prefill chunk may take: all of it or nothing. The
        candidate has ``remaining`` tokens to compute; ``waiting`` prompts wait for prefill (the
        candidate among them) with ``behind`` tokens besides the candidate's."""
        if not self.finishing or self._price is None or budget <= 0:
            return budget
        fixed_s, token_s = self._price
        delay_s = self.finishing * token_s  # per token packed: the finishing prompts' wait
        per_step = max(1, self._step_tokens - self._decodes)  # prefill tokens a step takes
        if remaining <= budget:
            # it would finish here; left out, it finishes at the end of the next step, which
            # also computes what is queued behind it (up to that step's budget)
            next_step_s = fixed_s + min(behind, max(0, per_step - remaining)) * token_s
            return budget if remaining * delay_s <= next_step_s else 0
        # a chunk that does not finish its prompt saves the prompts waiting a step only when it
        # moves their last step's boundary: ``k / per_step`` of a step each, for k tokens
        return budget if per_step * delay_s <= waiting * fixed_s else 0
