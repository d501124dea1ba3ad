"""The decision-theoretic stop rule: stop when the remaining gain is worth less than the steps it costs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bayes_grpo.errors import ModelError
from bayes_grpo.forecast import Forecast
from bayes_grpo.settings import STOP_THRESHOLD, STOP_TOLERANCE
from bayes_grpo.stopping.base import StopRule
from bayes_grpo.stopping.decision import StopDecision, decision
from bayes_grpo.stopping.evidence import RelativeTo, stop_evidence


@dataclass(frozen=True)
class ValueRule(StopRule):
    """Stop when ``value_per_reward * E[remaining gain] < cost_per_step * remaining steps``.

    Parameters
    ----------
    value_per_reward : float
        The worth of one unit of reward.
    cost_per_step : float
        The cost of one training step (e.g. GPU-hours per step x price), in the same currency.
    threshold, tolerance, relative_to
        Only for the probabilities the decision reports beside its verdict.

    Raises
    ------
    ModelError
        For a negative value or cost.

    Example
    -------
    >>> ValueRule(value_per_reward=1000.0, cost_per_step=0.5).decide(fc).optimal_stop_step  # doctest: +SKIP
    """

    value_per_reward: float
    cost_per_step: float
    threshold: float = STOP_THRESHOLD
    tolerance: float = STOP_TOLERANCE
    relative_to: RelativeTo = "spread"

    def __post_init__(self) -> None:
        if self.value_per_reward < 0 or self.cost_per_step < 0:
            raise ModelError(f"value_per_reward and cost_per_step must be >= 0, got {self.value_per_reward} and {self.cost_per_step}")

    def decide(self, forecast: Forecast) -> StopDecision:
        """Compare the value of the expected remaining gain with the cost of the remaining steps; name the best step to stop at."""
        evidence = stop_evidence(forecast)
        step, total = evidence.step, evidence.total_steps
        value = float(self.value_per_reward * evidence.gain.mean())
        cost = float(self.cost_per_step * max(total - step, 0))
        ahead = forecast.steps >= step
        utility = self.value_per_reward * forecast.curves[:, ahead].mean(axis=0) - self.cost_per_step * forecast.steps[ahead]
        optimal = int(forecast.steps[ahead][np.argmax(utility)])
        reason = "end" if step >= total else ("value" if value < cost else "gain")
        return decision(
            forecast, should_stop=reason != "gain", reason=reason, rule=type(self).__name__, evidence=evidence,
            threshold=self.threshold, tolerance=self.tolerance, relative_to=self.relative_to,
            value_of_gain=value, cost_of_rest=cost, optimal_stop_step=optimal,
        )  # fmt: skip
