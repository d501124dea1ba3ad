"""Baseline stop rule: patience, as ``EarlyStoppingCallback`` or Optuna's ``PatientPruner`` apply it to a smoothed reward."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bayes_grpo.errors import ModelError
from bayes_grpo.forecast import Forecast
from bayes_grpo.settings import SMOOTHING_BANDWIDTH
from bayes_grpo.stopping.base import StopRule
from bayes_grpo.stopping.decision import StopDecision


def causal_smoothed(steps: np.ndarray, rewards: np.ndarray, span: float, bandwidth: float = SMOOTHING_BANDWIDTH) -> np.ndarray:
    """At each logged step, the Gaussian-kernel smoothed reward of the steps logged up to it (what a live rule can know).

    The kernel is :func:`bayes_grpo.measures.smoothed`'s (standard deviation ``bandwidth * span`` steps), one-sided
    because the future is not logged yet.
    """
    steps = np.asarray(steps, dtype=float)
    rewards = np.asarray(rewards, dtype=float)
    h = max(bandwidth * span, 1e-9)
    out = np.empty(steps.size)
    chunk = 1024
    for start in range(0, steps.size, chunk):
        query = steps[start : start + chunk, None]
        weights = np.exp(-0.5 * ((query - steps[None, :]) / h) ** 2) * (steps[None, :] <= query)
        out[start : start + chunk] = weights @ rewards / weights.sum(axis=1)
    return out


@dataclass(frozen=True)
class PatienceRule(StopRule):
    """Stop once the causally smoothed reward has set no new best for ``patience`` of the planned steps.

    Parameters
    ----------
    patience : float
        Share of the planned steps without a new best (default 0.1).
    min_delta : float
        A new best must beat the old by more than this (reward units).

    Example
    -------
    >>> PatienceRule(patience=0.2).decide(fc).should_stop  # doctest: +SKIP
    """

    patience: float = 0.1
    min_delta: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 < self.patience <= 1.0:
            raise ModelError(f"patience must be in (0, 1], got {self.patience}")
        if self.min_delta < 0:
            raise ModelError(f"min_delta must be >= 0, got {self.min_delta}")

    def decide(self, forecast: Forecast) -> StopDecision:
        """Stop when the best causally smoothed reward so far lies ``patience`` of the plan or more behind the last logged step."""
        steps, rewards = forecast.observed_steps, forecast.observed_rewards
        if steps.size == 0:
            return self.decision(forecast, False, "patience", "nothing is logged yet")
        curve = causal_smoothed(steps, rewards, span=max(float(forecast.total_steps - steps[0]), 1.0))
        best_index, best = 0, curve[0]
        for i, value in enumerate(curve):
            if value > best + self.min_delta:
                best_index, best = i, value
        waited = float(steps[-1] - steps[best_index])
        stop = waited >= self.patience * forecast.total_steps
        return self.decision(forecast, stop, "patience", f"no new best smoothed reward for {waited:.0f} steps since step {steps[best_index]:.0f} (patience {self.patience:.0%} of the plan)")
