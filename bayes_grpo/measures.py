"""Run-level measures, defined once: final reward, spread, cut, smoothing, weighted quantile.

The forecast, the stopping rule, the sweeps, the report, the CLI and the
evaluation code (the repository's ``evaluation/``, not shipped) all use these
functions, so "final reward" or "spread" means the same thing everywhere.
Definitions follow the project's evaluation protocol:

* **final reward**: mean reward over the last 10% of logged steps;
* **spread**: the 10-90% quantile range of the logged rewards;
* **persistence**: the mean of the last 10 logged rewards;
* **cut**: a run as it looked at a fraction of its planned total steps;
* **smoothed**: Nadaraya-Watson Gaussian-kernel smoother with a bandwidth of 8%
  of the run's steps.

The scores built on them (regret, quantile score, interval
outcomes, the hardest third) are in ``evaluation.scoring``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from bayes_grpo.settings import FINAL_WINDOW_FRACTION, PERSISTENCE_POINTS, SMOOTHING_BANDWIDTH

if TYPE_CHECKING:
    from bayes_grpo.logs import RunLog

_SPREAD_FLOOR = 1e-9


def horizon(run: RunLog) -> int:
    """Planned total steps of a run, else its last logged step."""
    return int(run.total_steps or run.steps[-1])


def final_window_size(n_points: int, fraction: float = FINAL_WINDOW_FRACTION) -> int:
    """Number of trailing logged points that define the final reward (at least 1)."""
    return max(1, int(round(n_points * fraction)))


def final_reward(rewards: np.ndarray, fraction: float = FINAL_WINDOW_FRACTION) -> float:
    """Mean reward over the last ``fraction`` of the logged steps."""
    rewards = np.asarray(rewards, dtype=float)
    return float(rewards[-final_window_size(rewards.size, fraction) :].mean())


def persistence(rewards: np.ndarray, points: int = PERSISTENCE_POINTS) -> float:
    """Persistence forecast of the final reward: the mean of the last ``points`` logged rewards (the baseline
    forecasts are judged against, and the level the calibration layer draws them towards)."""
    return float(np.asarray(rewards, dtype=float)[-points:].mean())


def reward_spread(rewards: np.ndarray) -> float:
    """The 10-90% quantile range of the rewards (floored so it can divide)."""
    rewards = np.asarray(rewards, dtype=float)
    if rewards.size == 0:
        return _SPREAD_FLOOR
    q10, q90 = np.quantile(rewards, [0.1, 0.9])
    return max(float(q90 - q10), _SPREAD_FLOOR)


def cut(run: RunLog, fraction: float, total_steps: int | None = None) -> RunLog:
    """The run as it looked at ``fraction`` of its total steps (cut by step, at least 3 points kept)."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    total = total_steps if total_steps is not None else horizon(run)
    step = fraction * total
    n_seen = max(3, int(np.searchsorted(run.steps, step, side="right")))
    return run.head(int(run.steps[min(n_seen, len(run.steps)) - 1]))


def smoother_weights(steps: np.ndarray, at: Any, bandwidth: float = SMOOTHING_BANDWIDTH, span: float | None = None) -> np.ndarray:
    """The weights :func:`smoothed` gives each logged reward in its value at step(s) ``at`` (each row sums to 1; one row
    for a scalar ``at``).

    The kernel's standard deviation is ``bandwidth * span`` steps, ``span`` the
    run's step range (default: last minus first logged step, at least 1).
    """
    steps = np.asarray(steps, dtype=float)
    span = span if span is not None else max(float(steps[-1] - steps[0]), 1.0)
    h = max(bandwidth * span, 1e-9)
    weights = np.exp(-0.5 * ((np.asarray(at, dtype=float)[..., None] - steps) / h) ** 2)
    return weights / weights.sum(axis=-1, keepdims=True)


def smoothed(steps: np.ndarray, rewards: np.ndarray, bandwidth: float = SMOOTHING_BANDWIDTH, span: float | None = None) -> np.ndarray:
    """Gaussian-kernel (Nadaraya-Watson) smoother of ``rewards`` evaluated at ``steps`` (weights: :func:`smoother_weights`)."""
    steps = np.asarray(steps, dtype=float)
    rewards = np.asarray(rewards, dtype=float)
    if steps.size == 0:
        return np.empty(0)
    if steps.size >= _CONVOLVE_FROM and _evenly_spaced(steps):
        return _smoothed_by_convolution(steps, rewards, bandwidth, span)
    # Chunked to bound memory on long logs (O(n * chunk)).
    chunk = 2048
    return np.concatenate([smoother_weights(steps, steps[start : start + chunk], bandwidth, span) @ rewards for start in range(0, steps.size, chunk)])


#: From this many evenly spaced logged steps on, :func:`smoothed` convolves (the same sums, without an n x n kernel).
_CONVOLVE_FROM = 64


def _evenly_spaced(steps: np.ndarray) -> bool:
    """Whether ``steps`` (increasing) are logged at one fixed interval."""
    gaps = np.diff(steps)
    return bool(gaps.size) and bool(np.all(gaps == gaps[0])) and gaps[0] > 0


def _smoothed_by_convolution(steps: np.ndarray, rewards: np.ndarray, bandwidth: float, span: float | None) -> np.ndarray:
    """:func:`smoothed` on evenly spaced steps: the kernel depends only on the distance in steps, so the weighted
    sums and their normalisers are two convolutions with one kernel of ``2n - 1`` values (equal to the direct sums
    up to rounding; about fifty times faster at 1,000 steps)."""
    span = span if span is not None else max(float(steps[-1] - steps[0]), 1.0)
    h = max(bandwidth * span, 1e-9)
    n = steps.size
    kernel = np.exp(-0.5 * ((np.arange(-(n - 1), n) * (steps[1] - steps[0])) / h) ** 2)
    centred = slice(n - 1, 2 * n - 1)  # the full convolution's entries at the logged steps themselves
    return np.convolve(rewards, kernel)[centred] / np.convolve(np.ones(n), kernel)[centred]


def step_noise(rewards: np.ndarray) -> float:
    """Per-step logging noise of a reward series: the MAD of its first differences / sqrt 2 (robust to its trend).

    Unlike :func:`bayes_grpo.prepare.noise_scale` (which the model uses) it has no floor at a share of the
    rewards' spread, which would count a smooth rise as noise; rewards so discrete that the MAD is 0 get the
    plain SD of the differences / sqrt 2 (0 for fewer than two rewards).
    """
    diffs = np.diff(np.asarray(rewards, dtype=float))
    if diffs.size == 0:
        return 0.0
    mad = 1.4826 * float(np.median(np.abs(diffs - np.median(diffs))))
    return (mad if mad > 0 else float(np.std(diffs))) / np.sqrt(2.0)


def weighted_quantile(values: Sequence[float], q: float, weights: Sequence[float] | None = None) -> float:
    """The ``q`` quantile of ``values`` when each counts ``weights`` times (NaN values left out).

    The sorted values' cumulative weight first reaches ``q`` of the total at the
    quantile; where it reaches it exactly, the quantile is halfway to the next value.
    Equal weights thus give the ordinary median at ``q = 0.5`` (the middle value, or
    the mean of the two middle ones), and a group of values holding exactly half the
    weight meets the other half midway whatever the number of values in each.

    Parameters
    ----------
    values : sequence of float
        The values.
    q : float
        Quantile in [0, 1].
    weights : sequence of float, optional
        Non-negative weight of each value (default: all 1).

    Returns
    -------
    float
        NaN when no value with a positive weight is left.

    Example
    -------
    >>> weighted_quantile([1.0, 2.0, 3.0, 4.0], 0.5)
    2.5
    >>> weighted_quantile([1.0, 2.0, 3.0], 0.5, weights=[1.0, 1.0, 4.0])
    3.0
    """
    values = np.asarray(values, dtype=float)
    weights = np.ones_like(values) if weights is None else np.asarray(weights, dtype=float)
    keep = np.isfinite(values) & (weights > 0)
    values, weights = values[keep], weights[keep]
    if values.size == 0:
        return float("nan")
    order = np.argsort(values, kind="stable")
    values, cumulative = values[order], np.cumsum(weights[order])
    target = q * cumulative[-1]
    tolerance = 1e-9 * cumulative[-1]
    i = min(int(np.searchsorted(cumulative, target - tolerance, side="left")), values.size - 1)
    if i < values.size - 1 and abs(cumulative[i] - target) <= tolerance:
        return float(0.5 * (values[i] + values[i + 1]))
    return float(values[i])
