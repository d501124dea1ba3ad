"""Baseline stop rule: stop at a fixed share of the planned steps (arXiv 2507.18014 finds little gain past 40-80% of an epoch)."""

from __future__ import annotations

from dataclasses import dataclass

from bayes_grpo.errors import ModelError
from bayes_grpo.forecast import Forecast
from bayes_grpo.stopping.base import StopRule
from bayes_grpo.stopping.decision import StopDecision


@dataclass(frozen=True)
class FixedFractionRule(StopRule):
    """Stop once ``fraction`` of the planned steps are logged, whatever the rewards say.

    The trivial baseline every forecast-based rule must beat; the backtest reports it beside them.

    Parameters
    ----------
    fraction : float
        In (0, 1].

    Example
    -------
    >>> FixedFractionRule(0.8).decide(fc).should_stop  # doctest: +SKIP
    """

    fraction: float = 0.8

    def __post_init__(self) -> None:
        if not 0.0 < self.fraction <= 1.0:
            raise ModelError(f"fraction must be in (0, 1], got {self.fraction}")

    def decide(self, forecast: Forecast) -> StopDecision:
        """Stop at or past ``fraction`` of ``forecast.total_steps``."""
        step = float(forecast.last_observed_step or 0)
        reached = step >= self.fraction * forecast.total_steps - 1e-9
        return self.decision(forecast, reached, "fraction", f"{step / forecast.total_steps:.0%} of the planned steps are done (the rule stops at {self.fraction:.0%})")
