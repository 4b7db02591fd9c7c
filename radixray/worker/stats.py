"""Engine counters: hit rate, tokens by miss cause, throughput (EWMA), preemptions."""

from __future__ import annotations

import time

from .request import MISS_CAUSES

__all__ = ["EngineStats", "Ewma", "StepCostModel"]


class Ewma:
    """Exponentially weighted moving average; ``value`` is None until the first sample."""

    def __init__(self, alpha: float = 0.2):
        self.alpha = alpha
        self.value: float | None = None

    def update(self, x: float) -> None:
        self.value = x if self.value is None else self.alpha * x + (1 - self.alpha) * self.value


class StepCostModel:
    """Fits ``step_seconds ~ overhead + tokens / rate`` over recent prefill steps (exponentially
    weighted least squares).

    A plain tokens/seconds ratio is biased by the fixed cost of a step: a worker that happened
    to prefill long prompts looks faster than one that prefilled short ones, a router then
    favours it, and it keeps looking fast. Separating the per-step overhead from the marginal
    per-token cost makes identical workers report identical rates whatever their mix.
    """

    def __init__(self, decay: float = 0.95):
        self.decay = decay
        self._s = [0.0] * 5  # weights, sum x, sum y, sum x^2, sum x*y

    def update(self, tokens: int, seconds: float) -> None:
        d = self.decay
        s0, sx, sy, sxx, sxy = self._s
        x, y = float(tokens), float(seconds)
        self._s = [d * s0 + 1, d * sx + x, d * sy + y, d * sxx + x * x, d * sxy + x * y]

    def fit(self) -> tuple[float, float] | None:
        """(overhead seconds, tokens per second), or None before any prefill step."""
        s0, sx, sy, sxx, sxy = self._s
        if s0 == 0 or sx <= 0:
            return None
        mean_x = sx / s0
        var_x = sxx / s0 - mean_x * mean_x
        if var_x > (0.05 * mean_x) ** 2:  # enough spread in step sizes to separate the two
            slope = (sxy / s0 - mean_x * sy / s0) / var_x
            intercept = sy / s0 - slope * mean_x
            if slope > 0 and intercept >= 0:
                return intercept, 1.0 / slope
        if sy <= 0:
            return None
        return 0.0, sx / sy  # no spread in step sizes yet: the plain ratio


class EngineStats:
    def __init__(self):
        self.started = time.monotonic()
        self.requests_finished = 0
        self.requests_aborted = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.miss_tokens = dict.fromkeys(MISS_CAUSES, 0)
        self.steps = 0
        self.prefill_tokens = 0
        self.decode_tokens = 0
        self.prefill_cost = StepCostModel()  # steps that prefill (chunks of mixed steps)
        self.decode_step_time = Ewma()  # seconds per step for steps that are decode only
        self.decode_rate = Ewma()  # tokens/s of decode-only steps
        self.step_time = Ewma()

    def record_admission(self, prompt_tokens: int, miss: dict[str, int]) -> None:
        self.prompt_tokens += prompt_tokens
        for k, v in miss.items():
            self.miss_tokens[k] += v

    def record_step(self, prefill_tokens: int, decode_tokens: int, seconds: float) -> None:
        self.steps += 1
        self.prefill_tokens += prefill_tokens
        self.decode_tokens += decode_tokens
        self.step_time.update(seconds)
        if prefill_tokens and seconds > 0:
            self.prefill_cost.update(prefill_tokens, seconds)
        elif decode_tokens and seconds > 0:
            self.decode_step_time.update(seconds)
            self.decode_rate.update(decode_tokens / seconds)

    @property
    def hit_rate(self) -> float:
        return self.miss_tokens["cached"] / self.prompt_tokens if self.prompt_tokens else 0.0

    def as_dict(self) -> dict:
        fit = self.prefill_cost.fit()
        return {
            "requests_finished": self.requests_finished,
            "requests_aborted": self.requests_aborted,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.miss_tokens["cached"],
            "hit_rate": self.hit_rate,
            "miss_tokens": dict(self.miss_tokens),
            "steps": self.steps,
            "prefill_tokens": self.prefill_tokens,
            "decode_tokens": self.decode_tokens,
            "prefill_tokens_per_s": fit[1] if fit else None,
            "prefill_overhead_s": fit[0] if fit else None,
            "decode_step_s": self.decode_step_time.value,
            "decode_tokens_per_s": self.decode_rate.value,
        }
