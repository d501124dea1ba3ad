"""Scores of forecasts and stops, on the run-level measures of :mod:`bayes_grpo.measures`.

Moved out of the package: only the evaluation (calibration, the stopping
backtest, the shapes suite), the benchmarks and the tests use them.

* **persistence** baseline: :func:`bayes_grpo.measures.persistence` (the package's calibration layer
  draws forecasts towards it, so it is defined there);
* **best step**: the logged step with the highest smoothed reward;
* **regret** of a stop: (S at the last step - S at the stop) / spread, S the
  smoother of the whole run, and the chance that **logging noise alone** makes a stop count as bad
  (:func:`noise_bad_probability`), and how far a dip at a stop lies beyond that noise (:func:`dip_noise_z`);
* **quantile score**: mean pinball loss over the forecast quantiles, over spread;
* **interval outcome**: where the truth falls against an interval (coverage);
* **change after the cut** and the **hardest third** of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from scipy.stats import norm

from bayes_grpo.measures import final_reward, persistence, reward_spread, smoothed, smoother_weights, step_noise, weighted_quantile
from bayes_grpo.settings import SMOOTHING_BANDWIDTH


def best_step(steps: np.ndarray, rewards: np.ndarray, bandwidth: float = SMOOTHING_BANDWIDTH) -> int | None:
    """The logged step with the highest smoothed reward among the steps given (None when empty)."""
    steps = np.asarray(steps, dtype=float)
    if steps.size == 0:
        return None
    return int(steps[int(np.argmax(smoothed(steps, rewards, bandwidth)))])


def regret(steps: np.ndarray, rewards: np.ndarray, stop_step: float | None, bandwidth: float = SMOOTHING_BANDWIDTH) -> float:
    """Regret of stopping at ``stop_step``: (S at the last step - S at the stop) / spread; 0 when never stopped."""
    steps = np.asarray(steps, dtype=float)
    if stop_step is None or stop_step >= steps[-1]:
        return 0.0
    curve = smoothed(steps, rewards, bandwidth)
    at_stop = float(np.interp(stop_step, steps, curve))
    return (float(curve[-1]) - at_stop) / reward_spread(rewards)


def noise_bad_probability(
    steps: np.ndarray, rewards: np.ndarray, stop_step: float | None, limit: float = 0.05, bandwidth: float = SMOOTHING_BANDWIDTH
) -> float:
    """Probability that logging noise alone makes a stop at ``stop_step`` count as bad (:func:`regret` above ``limit``).

    Suppose the run's expected reward did not change from the stop on, so that a stop there
    loses nothing. Its regret is still not 0: S at the last step and S at the stop average
    different logged rewards, each with its own noise. S is linear in the rewards, so that
    difference is Normal with SD ``sigma * ||w_last - w_stop||`` (:func:`bayes_grpo.measures.smoother_weights`;
    ``sigma`` the per-step noise, :func:`bayes_grpo.measures.step_noise`, independent steps assumed). No rule can know
    the noise after its stop, so even a rule that stopped every run exactly where its reward
    stopped rising would see this share of its stops counted as bad.
    0 when never stopped, at the last step, or for a run without spread.
    """
    steps = np.asarray(steps, dtype=float)
    rewards = np.asarray(rewards, dtype=float)
    spread = reward_spread(rewards)
    if stop_step is None or stop_step >= steps[-1] or not spread > 0:
        return 0.0
    sd = smoothed_difference_noise(steps, rewards, stop_step, steps[-1], bandwidth)
    return float(norm.sf(limit * spread / sd)) if sd > 0 else 0.0


def smoothed_difference_noise(steps: np.ndarray, rewards: np.ndarray, first: float, second: float, bandwidth: float = SMOOTHING_BANDWIDTH) -> float:
    """SD that logging noise alone gives S at ``second`` minus S at ``first``: S is linear in the rewards, so it is the
    per-step noise (:func:`bayes_grpo.measures.step_noise`, independent steps assumed) times the norm of the difference
    of the smoother's weights at the two steps."""
    weights = smoother_weights(steps, [first, second], bandwidth)
    return step_noise(rewards) * float(np.linalg.norm(np.diff(weights, axis=0)))


def dip_noise_z(steps: np.ndarray, rewards: np.ndarray, stop_step: float, bandwidth: float = SMOOTHING_BANDWIDTH) -> float:
    """How many noise SDs S at ``stop_step`` lies below its best before the stop: the dip's depth over the SD that
    logging noise alone gives the difference of S between the two steps (:func:`smoothed_difference_noise`).

    A stop "inside a dip the run recovered from" is judged on S; on a run whose logged mean only jitters, S wanders by
    about this SD, so a dip of 1 SD is the smoother's noise, not a fall the run recovered from. 0 at or before the
    best step; inf for a run without noise.
    """
    steps = np.asarray(steps, dtype=float)
    rewards = np.asarray(rewards, dtype=float)
    before = steps <= stop_step
    if not before.any():
        return 0.0
    curve = smoothed(steps, rewards, bandwidth)
    best = int(np.argmax(np.where(before, curve, -np.inf)))
    depth = float(curve[best]) - float(np.interp(stop_step, steps, curve))
    if depth <= 0:
        return 0.0
    sd = smoothed_difference_noise(steps, rewards, steps[best], stop_step, bandwidth)
    return depth / sd if sd > 0 else float("inf")


def pinball_loss(truth: float, quantiles: Mapping[float, float]) -> float:
    """Mean pinball (quantile) loss of predicted ``{q: value}`` quantiles against ``truth``."""
    losses = [max(q * (truth - v), (q - 1.0) * (truth - v)) for q, v in quantiles.items()]
    return float(np.mean(losses))


def quantile_score(truth: float, quantiles: Mapping[float, float], spread: float) -> float:
    """Pinball loss in units of ``spread`` (the run's reward spread): lower is better."""
    return pinball_loss(truth, quantiles) / spread


def interval_outcome(truth: float, lo: float, hi: float) -> str:
    """'below', 'inside' or 'above': where ``truth`` falls relative to the interval ``[lo, hi]``."""
    return "below" if truth < lo else ("above" if truth > hi else "inside")


def change_after_cut(rewards_full: np.ndarray, rewards_head: np.ndarray) -> float:
    """|final - persistence| / spread: how much a run moved after the cut (to pick the hardest runs)."""
    return abs(final_reward(rewards_full) - persistence(rewards_head)) / reward_spread(rewards_full)


def hardest_third(values: Sequence[float], weights: Sequence[float] | None = None) -> np.ndarray:
    """Boolean mask of the top third of ``values`` (e.g. change after the cut).

    With ``weights`` the top third is of the total weight (the cut is the weighted
    2/3 quantile, :func:`weighted_quantile`), so a value counted less (a run of a
    source with many runs) moves the cut less.
    """
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        return np.zeros(0, bool)
    if weights is None:
        return values >= np.quantile(values, 2.0 / 3.0)
    return values >= weighted_quantile(values, 2.0 / 3.0, weights)
