"""The run's own trend: where a run keeps climbing past the bend its curve expected, a share of the draws carries on along its recent slope.

:func:`trend_weight` asks the curve and a straight-line trend to forecast the last part of the
log from the steps before it; :func:`trend_paths` continues that share of the draws from the
last step along the log's recent slope, which decays slowly (:data:`TREND_HORIZON`).
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import arviz as az
import numpy as np
from scipy.special import expit

from bayes_grpo.config import ModelConfig
from bayes_grpo.population import (
    PopulationPosterior, log_likelihood, logsumexp_rows,
)  # fmt: skip
from bayes_grpo.prepare import PreparedRun, bin_observations, noise_scale
from bayes_grpo.forecast.conditioning import Conditioning


#: Prior probability that a run's rewards carry on along their recent trend after the last step rather
#: than follow the saturating curve; :func:`trend_weight` updates it on the run's own recent steps.
TREND_PRIOR = 0.1
#: The last share of the logged (binned) points on which the two are compared, and the trend measured.
TREND_WINDOW = 0.3
#: Prior SD of the trend's slope (normalised reward per unit progress): a measured slope is shrunk towards 0.
TREND_PRIOR_SD = 3.0
#: A trend decays over this much progress (the median of its exponential horizon) ...
TREND_HORIZON = 1.0
#: ... and each draw's horizon is that times a log-normal factor of this SD: how long a rise lasts is uncertain.
TREND_HORIZON_SD = 1.0
#: A run is climbing when the slope over the window is above this many standard errors; only then can a trend carry on.
TREND_CLEAR_SE = 2.0
#: Fewest binned points before and in the window for the comparison; with fewer, the prior holds.
TREND_MIN_POINTS = 4


def step_noise_sd(config: ModelConfig, prepared: PreparedRun) -> float:
    """The log's per-step noise in normalised units (:func:`bayes_grpo.prepare.noise_scale`), floored by the model's
    ``noise_floor``: the noise the trend, its comparison with the curve and the departure at the cut see the log through."""
    return max(noise_scale(prepared.z), config.noise_floor)


def _window_split(prepared: PreparedRun) -> tuple[PreparedRun, np.ndarray] | None:
    """The run without its last :data:`TREND_WINDOW` of logged steps (same normalisation), and that window's
    mask; None when either part would have fewer than :data:`TREND_MIN_POINTS` steps."""
    n = prepared.t.size
    size = max(TREND_MIN_POINTS, int(np.ceil(TREND_WINDOW * n)))
    if n - size < TREND_MIN_POINTS:
        return None
    earlier = replace(prepared, steps=prepared.steps[:-size], t=prepared.t[:-size], z=prepared.z[:-size])
    return earlier, np.arange(n) >= n - size


def linear_trend(t: np.ndarray, z: np.ndarray, counts: np.ndarray, step_sd: float) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and covariance of ``(level at t[-1], slope)`` of binned rewards under a flat level prior
    and a Normal(0, :data:`TREND_PRIOR_SD`) slope prior; bins have noise ``step_sd / sqrt(count)``."""
    design = np.column_stack([np.ones_like(t), t - t[-1]])
    precision = design.T @ (design * (counts / step_sd**2)[:, None]) + np.diag([0.0, 1.0 / TREND_PRIOR_SD**2])
    cov = np.linalg.inv(precision + np.diag([1e-12, 0.0]))
    mean = cov @ (design.T @ (counts * z / step_sd**2))
    return mean, cov


def _rising(mean: np.ndarray, cov: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`linear_trend`'s posterior restricted to a trend that does not fall: a falling one becomes flat at
    its level given a zero slope. Only a rise carries on: a fall is the curve's, the wander's and the stopping
    rule's to judge (a dip recovers)."""
    if mean[1] >= 0:
        return mean, cov
    level = mean[0] - cov[0, 1] / cov[1, 1] * mean[1]
    return np.array([level, 0.0]), np.diag([cov[0, 0] - cov[0, 1] ** 2 / cov[1, 1], 0.0])


def _decayed(ahead: np.ndarray, horizon: float | np.ndarray = TREND_HORIZON) -> np.ndarray:
    """How far a unit slope carries over ``ahead`` progress when it decays exponentially over ``horizon``."""
    return horizon * -np.expm1(-np.clip(ahead, 0, None) / horizon)


def trend_weight(model: PopulationPosterior, prepared: PreparedRun, conditioned: Conditioning, prior: float | None = None) -> float:
    """Posterior probability that the run follows its own recent trend rather than the population's curve.

    Both are asked to forecast the last :data:`TREND_WINDOW` of the logged points from
    the points before it (a leave-future-out comparison on the run itself): the curve
    by its posterior given the earlier points, obtained from the run's ``conditioned``
    particles by Pareto-smoothed importance weights that take the window out
    (approximate leave-future-out, Buerkner, Gabry and Vehtari 2020), the trend by a
    straight line through the end of the earlier points, decaying as the forecast's
    does (:func:`linear_trend`, :data:`TREND_HORIZON`). The prior odds
    :data:`TREND_PRIOR` are updated by the ratio of the two predictive densities: a run
    whose rewards kept climbing where the curve expected a bend moves to its trend, a
    run that bent as the curve expected stays with the curve. A run whose rewards are
    not clearly climbing over the window (slope below :data:`TREND_CLEAR_SE` standard
    errors) has no rise to carry on: 0.
    """
    prior = TREND_PRIOR if prior is None else prior
    split = _window_split(prepared)
    if split is None or prior <= 0:
        return float(prior if split is None else 0.0)
    earlier, window = split
    config = model.model_config
    t_w, z_w, c_w = bin_observations(prepared.t[window], prepared.z[window], config.forecast_bins)
    noise = step_noise_sd(config, prepared)
    recent, recent_cov = linear_trend(t_w, z_w, c_w, noise)
    if recent[1] < TREND_CLEAR_SE * np.sqrt(recent_cov[1, 1]):
        return 0.0  # not clearly climbing now: there is no rise to carry on
    ll_w = log_likelihood(config, conditioned.theta, t_w, z_w, c_w)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a large k-hat only makes the comparison rougher
        without_window, _ = az.psislw(conditioned.log_weights - ll_w)
    curve = float(logsumexp_rows(np.asarray(without_window) + ll_w))

    t_e, z_e, c_e = bin_observations(earlier.t, earlier.z, config.forecast_bins)
    tail = max(TREND_MIN_POINTS, min(t_e.size, t_w.size))
    mean, cov = _rising(*linear_trend(t_e[-tail:], z_e[-tail:], c_e[-tail:], noise))
    design = np.column_stack([np.ones_like(t_w), _decayed(t_w - t_e[-1])])
    own = _low_rank_normal_logpdf(z_w, design @ mean, noise**2 / c_w, design, cov)
    return float(expit(np.log(prior) - np.log1p(-prior) + own - curve))


def _low_rank_normal_logpdf(x: np.ndarray, mean: np.ndarray, noise_var: np.ndarray, factor: np.ndarray, cov: np.ndarray) -> float:
    """Log density at ``x`` of Normal(``mean``, diag(``noise_var``) + ``factor @ cov @ factor.T``).

    By the Woodbury identity and the matrix determinant lemma, in time linear in ``x.size`` (``factor``
    has two columns): SciPy's dense eigendecomposition of the (up to 120 x 120) covariance took a third of a
    forecast on a loaded machine.
    ``cov`` may be singular (a flat trend's slope has no spread).
    """
    resid = x - mean
    scaled = factor / noise_var[:, None]
    capacitance = np.eye(cov.shape[0]) + cov @ (factor.T @ scaled)
    projected = scaled.T @ resid
    quad = resid @ (resid / noise_var) - projected @ np.linalg.solve(capacitance, cov @ projected)
    log_det = np.sum(np.log(noise_var)) + np.log(np.linalg.det(capacitance))
    return float(-0.5 * (x.size * np.log(2 * np.pi) + log_det + quad))


def trend_paths(
    config: ModelConfig, prepared: PreparedRun, curves: np.ndarray, t_grid: np.ndarray, t_last: float, rng: np.random.Generator, weight: float
) -> np.ndarray:
    """Curve draws of which a share ``weight`` (:func:`trend_weight`) carry on along the log's recent trend.

    The trend is a straight line through the last :data:`TREND_WINDOW` of the logged
    points (:func:`linear_trend`, its slope shrunk towards zero and drawn from its
    posterior; a falling one is taken as flat, :func:`_rising`), continued from each chosen draw's level at
    the last step and decaying over a horizon of progress drawn per draw (median
    :data:`TREND_HORIZON`, log-normal spread :data:`TREND_HORIZON_SD`): some rises stop
    soon, some run to the end of the plan.
    """
    split = _window_split(prepared)
    window = split[1] if split is not None else np.ones(prepared.t.size, bool)
    t, z, counts = bin_observations(prepared.t[window], prepared.z[window], config.forecast_bins)
    if t.size < 2:
        return curves
    mean, cov = _rising(*linear_trend(t, z, counts, step_noise_sd(config, prepared)))
    n = curves.shape[0]
    slopes = mean[1] + np.sqrt(cov[1, 1]) * rng.standard_normal(n)
    chosen = rng.random(n) < weight
    last = min(int(np.searchsorted(t_grid, t_last)), t_grid.size - 1)
    horizons = TREND_HORIZON * np.exp(TREND_HORIZON_SD * rng.standard_normal(n))
    path = curves[:, [last]] + slopes[:, None] * _decayed((t_grid - t_last)[None], horizons[:, None])
    return np.where(chosen[:, None] & (t_grid > t_last)[None], path, curves)
