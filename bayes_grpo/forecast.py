"""Forecast a run's reward trajectory from the stored population posterior.

A forecast conditions one run on its logged steps without touching the
hierarchy: per-run parameters ``(r0, asinh gain, log tau, log beta, log sigma)`` are
drawn from the population posterior predictive for the run's covariates
(family, size, initial reward) and re-weighted by the likelihood of the run's
steps by importance sampling. Both densities come from the one model
definition in :mod:`bayes_grpo.population` (:class:`~bayes_grpo.population.RunPrior`,
:func:`~bayes_grpo.population.log_likelihood`); this module works on any
:class:`~bayes_grpo.population.PopulationPosterior` and does not import the
fitting code (see :func:`condition`: prior particles first;
when their weights degenerate, a multivariate t around the Laplace
approximation, mixed with the prior; weights stay exact ``prior * likelihood /
proposal``). This is a few vectorised NumPy passes, fast enough to run inside a
training loop, and the prior component keeps the bimodal "took off / not yet"
case that a Laplace approximation alone would miss.

Trajectories carry a model-discrepancy term: beyond the last logged step the
forecast may wander from the parametric curve as a Brownian motion with scale
``drift * sigma`` per unit of progress, so intervals stay honest for runs whose
shape the curve form does not capture.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr
from scipy.special import gammaln, logsumexp

from bayes_grpo.config import ModelConfig
from bayes_grpo.curves import plateau_progress, reward_curve
from bayes_grpo.errors import ModelError
from bayes_grpo.logs import RunLog
from bayes_grpo.population import PARAMS, PopulationPosterior, RunPrior, in_support, log_likelihood, natural, step_noise
from bayes_grpo.prepare import PreparedRun, bin_observations, prepare_run
from bayes_grpo.settings import FORECAST_QUANTILES

MAX_GRID_POINTS = 500


@dataclass
class FinalReward:
    """Posterior predictive of the reward level at ``total_steps``.

    Parameters
    ----------
    samples : ndarray
        Draws of the final reward level (the run's own reward scale).

    Example
    -------
    >>> final = FinalReward(np.array([0.4, 0.5, 0.6]))
    >>> round(final.mean, 2), final.quantile(0.5)
    (0.5, 0.5)
    """

    samples: np.ndarray

    @property
    def mean(self) -> float:
        """Posterior mean of the final reward."""
        return float(np.mean(self.samples))

    def quantile(self, q: float | np.ndarray) -> float | np.ndarray:
        """Posterior quantile(s) of the final reward.

        Parameters
        ----------
        q : float or array of float
            Probabilities in [0, 1].

        Returns
        -------
        float or ndarray
            A float for a scalar ``q``, else an array of the same shape.
        """
        value = np.quantile(self.samples, q)
        return float(value) if np.ndim(value) == 0 else value

    def interval(self, mass: float = 0.9) -> tuple[float, float]:
        """Central credible interval holding ``mass`` of the posterior.

        Parameters
        ----------
        mass : float
            Probability mass inside the interval (0.9: the 5% and 95% quantiles).

        Returns
        -------
        (float, float)
            Lower and upper bound.
        """
        lo, hi = np.quantile(self.samples, [(1 - mass) / 2, (1 + mass) / 2])
        return float(lo), float(hi)


@dataclass
class Forecast:
    """Posterior trajectories of one run's expected reward, on the run's own scale.

    Made by :func:`forecast` (or :meth:`bayes_grpo.model.FittedModel.forecast`).

    Attributes
    ----------
    run_id : str
        The run forecast.
    steps : ndarray
        Forecast grid (every step up to ``total_steps``, thinned to at most 500 points, always
        including the last logged step).
    draws : ndarray
        (n_draws, len(steps)): predictive of the reward level (curve plus model discrepancy).
    curves : ndarray
        The same draws of the parametric curve alone (what the stopping rule judges gains on).
    total_steps : int
        Planned length of the run.
    observed_steps, observed_rewards : ndarray
        What the forecast was conditioned on.
    params : dict
        Per-draw curve parameters ``r0, gain, tau, beta, sigma`` (normalised units) and ``unit``.
    plateau_step : ndarray
        Per-draw step where the curve reaches 95% of its total gain.
    current : ndarray
        Per-draw expected reward at the last logged step.
    prepared : PreparedRun
        The normalised run.
    ess : float
        Effective sample size of the importance weights.
    noise_floor : float
        The model's per-step noise floor (normalised units).

    Example
    -------
    >>> fc = bg.default_model().forecast(run.head(100), total_steps=400)  # doctest: +SKIP
    >>> fc.final.quantile(0.5), fc.final.interval(0.9)  # doctest: +SKIP
    """

    run_id: str
    steps: np.ndarray
    draws: np.ndarray
    curves: np.ndarray
    total_steps: int
    observed_steps: np.ndarray
    observed_rewards: np.ndarray
    params: dict[str, np.ndarray]
    plateau_step: np.ndarray
    current: np.ndarray
    prepared: PreparedRun = field(repr=False)
    ess: float = float("nan")
    noise_floor: float = ModelConfig.noise_floor

    @property
    def last_observed_step(self) -> int | None:
        """The last logged step the forecast saw (None for a run not yet started)."""
        return int(self.observed_steps[-1]) if self.observed_steps.size else None

    @property
    def step_noise(self) -> np.ndarray:
        """Per-draw noise of one logged step, in reward units (the likelihood's, noise floor included)."""
        return step_noise(self.params["sigma"], self.noise_floor) * self.prepared.unit

    @property
    def final(self) -> FinalReward:
        """The reward at ``total_steps``: ``.mean``, ``.quantile(q)``, ``.samples``."""
        return FinalReward(self.draws[:, -1])

    @property
    def remaining_gain(self) -> np.ndarray:
        """Per-draw expected reward still to gain between the last logged step and ``total_steps`` (curve only)."""
        return self.curves[:, -1] - self.current

    def at_steps(self, steps: np.ndarray) -> np.ndarray:
        """Trajectory draws interpolated at arbitrary steps: shape (n_draws, len(steps))."""
        steps = np.asarray(steps, dtype=float)
        right = np.clip(np.searchsorted(self.steps, steps), 1, self.steps.size - 1) if self.steps.size > 1 else np.zeros(steps.size, int)
        if self.steps.size == 1:
            return np.repeat(self.draws[:, :1], steps.size, axis=1)
        left = right - 1
        frac = np.clip((steps - self.steps[left]) / (self.steps[right] - self.steps[left]), 0.0, 1.0)
        return self.draws[:, left] * (1 - frac) + self.draws[:, right] * frac

    def to_frame(self) -> pd.DataFrame:
        """Columns ``step, mean, q05, q25, q50, q75, q95`` on the forecast grid."""
        quantiles = np.quantile(self.draws, FORECAST_QUANTILES, axis=0)
        frame = pd.DataFrame({"step": self.steps.astype(int), "mean": self.draws.mean(axis=0)})
        for q, row in zip(FORECAST_QUANTILES, quantiles):
            frame[f"q{int(round(q * 100)):02d}"] = row
        return frame

    def to_xarray(self) -> xr.Dataset:
        """Trajectory draws as an xarray Dataset with dims (draw, step)."""
        return xr.Dataset(
            {"reward": (("draw", "step"), self.draws), "plateau_step": ("draw", self.plateau_step)},
            coords={"step": self.steps.astype(int), "draw": np.arange(self.draws.shape[0])},
            attrs={"run_id": self.run_id, "total_steps": self.total_steps},
        )

    def plot(self, ax: Any = None, truth: RunLog | None = None) -> Any:
        """Fan chart: 50% and 90% bands, median, observed steps (and the truth, if given)."""
        import matplotlib.pyplot as plt

        ax = ax or plt.subplots(figsize=(6, 3.5))[1]
        frame = self.to_frame()
        ax.fill_between(frame.step, frame.q05, frame.q95, alpha=0.2, color="C0", label="90% interval")
        ax.fill_between(frame.step, frame.q25, frame.q75, alpha=0.35, color="C0", label="50% interval")
        ax.plot(frame.step, frame.q50, color="C0", lw=1.5, label="median")
        if truth is not None:
            ax.plot(truth.steps, truth.rewards, color="0.6", lw=0.6, label="full run")
        ax.plot(self.observed_steps, self.observed_rewards, color="k", lw=0.8, label="observed")
        if self.last_observed_step is not None:
            ax.axvline(self.last_observed_step, color="k", ls=":", lw=0.8)
        ax.set_xlabel("step")
        ax.set_ylabel("reward")
        ax.set_title(self.run_id, fontsize=9)
        return ax


def _ess(log_w: np.ndarray) -> float:
    w = np.exp(log_w - logsumexp(log_w))
    return float(1.0 / np.sum(w**2))


def condition(
    model: PopulationPosterior,
    prepared: PreparedRun,
    *,
    n_particles: int = 3000,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Importance-sample the run's parameters given its steps: (particles, normalised log weights).

    1. Particles from the population prior, weighted by the likelihood: enough
       when the run has few steps (weights stay spread out).
    2. Otherwise the posterior is peaked: find its mode (BFGS from the best
       particles), take a Laplace covariance from a finite-difference Hessian and
       propose from a multivariate t around it, mixed with the prior (defensive
       importance sampling keeps the "not taken off yet" mode if it has mass).
    3. If weights are still degenerate, refit the proposal to the weighted
       particles once more (moment matching).
    """
    rng = np.random.default_rng(seed)
    config = model.model_config
    prior = RunPrior(model, prepared, rng)
    t, z, counts = bin_observations(prepared.t, prepared.z, config.forecast_bins)

    def log_lik(theta: np.ndarray) -> np.ndarray:
        # A declared reward range bounds where the curve can start and end.
        return np.where(in_support(config, theta, prepared.kind), log_likelihood(config, theta, t, z, counts), -np.inf)

    theta = prior.sample(rng, n_particles)
    log_w = log_lik(theta)
    if _ess(log_w) >= 0.25 * n_particles:
        return theta, log_w - logsumexp(log_w)

    weights = np.exp(log_w - logsumexp(log_w))
    fallback = np.cov(theta.T, aweights=weights + 1e-300) + np.diag(np.full(len(PARAMS), 1e-4))
    mode, cov = _laplace(lambda x: log_lik(x) + prior.logpdf(x), theta[np.argsort(log_w)[-2:]], fallback)
    for _ in range(2):
        n_local = int(0.8 * n_particles)
        local = _mvt_sample(rng, mode, cov, n_local)
        theta = np.vstack([local, prior.sample(rng, n_particles - n_local)])
        log_prior = prior.logpdf(theta)
        log_q = np.logaddexp(np.log(0.8) + _mvt_logpdf(theta, mode, cov), np.log(0.2) + log_prior)
        log_w = log_prior + log_lik(theta) - log_q
        if _ess(log_w) >= 0.1 * n_particles:
            break
        w = np.exp(log_w - logsumexp(log_w))
        mode = w @ theta
        cov = np.cov(theta.T, aweights=w + 1e-300) * 1.5 + np.diag(np.full(len(PARAMS), 1e-8))
    return theta, log_w - logsumexp(log_w)


_T_DF = 5.0


def _laplace(log_post: Any, starts: np.ndarray, fallback_cov: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mode of ``log_post`` (vectorised over rows) and a positive-definite inverse-Hessian covariance.

    Where the Hessian cannot be taken (the mode sits on a boundary of the
    support, e.g. a declared reward range), ``fallback_cov`` is used instead.
    """
    from scipy.optimize import minimize

    dim, h = starts.shape[1], 1e-5
    steps = np.vstack([np.zeros(dim), np.eye(dim) * h])

    def objective(x: np.ndarray) -> tuple[float, np.ndarray]:
        # Value and forward-difference gradient from one vectorised evaluation.
        values = log_post(x[None] + steps)
        if not np.all(np.isfinite(values)):
            return 1e300, np.zeros(dim)
        return -values[0], -(values[1:] - values[0]) / h

    best = min((minimize(objective, x0, jac=True, method="BFGS", options={"gtol": 1e-2, "maxiter": 40}) for x0 in starts), key=lambda r: r.fun)
    mode = best.x
    h = 1e-3
    # Central-difference Hessian, all perturbed points evaluated in one vectorised call.
    eye = np.eye(dim) * h
    points = [mode]
    for i in range(dim):
        for j in range(dim):
            points += [mode + eye[i] + eye[j], mode + eye[i] - eye[j], mode - eye[i] + eye[j], mode - eye[i] - eye[j]]
    with np.errstate(invalid="ignore"):  # -inf on a support boundary: handled below via fallback_cov
        values = log_post(np.array(points))
        hessian = np.empty((dim, dim))
        k = 1
        for i in range(dim):
            for j in range(dim):
                pp, pm_, mp, mm = values[k : k + 4]
                hessian[i, j] = (pp - pm_ - mp + mm) / (4 * h * h)
                k += 4
    precision = -(hessian + hessian.T) / 2
    if not np.all(np.isfinite(precision)):
        return mode, fallback_cov
    eigval, eigvec = np.linalg.eigh(precision)
    eigval = np.clip(eigval, 1e-2, 1e8)
    cov = (eigvec / eigval) @ eigvec.T
    return mode, cov * 1.5


def _mvt_sample(rng: np.random.Generator, mode: np.ndarray, cov: np.ndarray, size: int) -> np.ndarray:
    chol = np.linalg.cholesky(cov)
    normal = rng.standard_normal((size, mode.size)) @ chol.T
    scale = np.sqrt(rng.chisquare(_T_DF, size) / _T_DF)
    return mode + normal / scale[:, None]


def _mvt_logpdf(x: np.ndarray, mode: np.ndarray, cov: np.ndarray) -> np.ndarray:
    chol = np.linalg.cholesky(cov)
    solved = np.linalg.solve(chol, (x - mode).T)
    maha = np.sum(solved**2, axis=0)
    dim = mode.size
    return (
        gammaln((_T_DF + dim) / 2)
        - gammaln(_T_DF / 2)
        - 0.5 * dim * np.log(_T_DF * np.pi)
        - np.sum(np.log(np.diag(chol)))
        - (_T_DF + dim) / 2 * np.log1p(maha / _T_DF)
    )


def forecast(
    model: PopulationPosterior,
    run: RunLog | None = None,
    total_steps: int | None = None,
    *,
    family: str | None = None,
    params_b: float | None = None,
    initial_reward: float | None = None,
    reward_range: tuple[float, float] | None = None,
    n_draws: int = 1000,
    drift: float | None = None,
    seed: int = 0,
) -> Forecast:
    """Forecast a run (finished, in progress, or not yet started) up to ``total_steps``.

    Parameters
    ----------
    model : PopulationPosterior
        A fitted population (e.g. :func:`bayes_grpo.default_model`).
    run : RunLog or None
        The logged steps so far; None for a run not yet started.
    total_steps : int, optional
        Planned length of the run (default: the run's metadata).
    family, params_b, initial_reward, reward_range : optional
        Override the run's metadata; for a run not yet started pass ``initial_reward``,
        ``total_steps`` and ``reward_range`` (and ``family``/``params_b`` when known).
    n_draws : int
        Trajectory draws returned (1000).
    drift : float, optional
        Scale of the Brownian discrepancy (default: ``model.model_config.drift``).
    seed : int
        Seed of the importance sampler and of the discrepancy paths.

    Returns
    -------
    Forecast

    Raises
    ------
    ModelError
        When ``total_steps`` is unknown or smaller than the last logged step, or a run not yet
        started lacks ``initial_reward``/``reward_range``.

    Example
    -------
    >>> fc = forecast(bg.default_model(), run.head(100), total_steps=400)  # doctest: +SKIP
    """
    if run is None and (total_steps is None or initial_reward is None):
        raise ModelError("forecasting a run not yet started needs total_steps= and initial_reward= (and reward_range=)")
    prepared = prepare_run(
        run,
        total_steps=total_steps,
        family=family,
        params_b=params_b,
        initial_reward=initial_reward,
        reward_range=reward_range,
    )
    theta, log_w = condition(model, prepared, seed=seed)
    rng = np.random.default_rng(seed + 1)
    picks = _systematic_resample(np.exp(log_w), n_draws, rng)
    sample = theta[picks]
    config = model.model_config
    p = natural(dict(zip(PARAMS, sample.T)))
    r0, gain, tau, beta = p["r0"], p["gain"], p["tau"], p["beta"]

    total = prepared.total_steps
    last = int(prepared.steps[-1]) if prepared.steps.size else 0
    grid = _grid(last, total)
    t_grid = grid / total
    curves = reward_curve(config.form, t_grid[None], r0[:, None], gain[:, None], tau[:, None], beta[:, None])
    t_last = last / total
    drift = float(config.drift if drift is None else drift)
    levels = curves + _brownian_discrepancy(rng, t_grid, t_last, drift * p["sigma"]) if drift > 0 else curves
    current = reward_curve(config.form, np.array([t_last]), r0, gain, tau, beta) if last else r0
    plateau_t = plateau_progress(config.form, tau, beta)
    return Forecast(
        run_id=prepared.run_id,
        steps=grid,
        draws=prepared.to_reward(levels),
        curves=prepared.to_reward(curves),
        total_steps=total,
        observed_steps=prepared.steps.astype(int),
        observed_rewards=prepared.to_reward(prepared.z),
        params={**p, "unit": prepared.unit},
        plateau_step=np.clip(plateau_t * total, 0, None),
        current=prepared.to_reward(np.asarray(current).ravel()),
        prepared=prepared,
        ess=float(1.0 / np.sum(np.exp(2 * log_w))),
        noise_floor=config.noise_floor,
    )


def _grid(last: int, total: int) -> np.ndarray:
    """Forecast steps: every step up to ``total`` (thinned to at most MAX_GRID_POINTS), always including ``last``."""
    grid = np.unique(np.linspace(1, total, min(total, MAX_GRID_POINTS)).round().astype(int))
    if last:
        grid = np.union1d(grid, [last])
    return grid.astype(float)


def _brownian_discrepancy(rng: np.random.Generator, t_grid: np.ndarray, t_last: float, scale: np.ndarray) -> np.ndarray:
    """Brownian paths that are zero up to ``t_last`` and wander with ``scale`` per unit progress after it."""
    ahead = np.clip(t_grid - t_last, 0, None)
    increments = np.diff(ahead, prepend=0.0)
    steps = rng.standard_normal((scale.size, t_grid.size)) * np.sqrt(increments)[None]
    return scale[:, None] * np.cumsum(steps, axis=1)


def _systematic_resample(weights: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    positions = (rng.random() + np.arange(n)) / n
    return np.minimum(np.searchsorted(np.cumsum(weights), positions), weights.size - 1)
