"""Forecast a run's reward trajectory from the stored population posterior.

A forecast conditions one run on its logged steps without touching the
hierarchy: per-run parameters ``(r0, gain, log tau, log beta, log sigma)`` are
drawn from the population posterior predictive for the run's covariates
(family, size, initial reward) and re-weighted by the likelihood of the run's
steps by importance sampling (see :func:`condition`: prior particles first;
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
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import xarray as xr
from scipy.special import gammaln, logsumexp

from bayes_grpo.curves import plateau_progress, reward_curve
from bayes_grpo.errors import ModelError
from bayes_grpo.logs import RunLog
from bayes_grpo.model import step_noise
from bayes_grpo.prepare import PreparedRun, bin_observations, centred_size, prepare_run, start_level

if TYPE_CHECKING:
    from bayes_grpo.model import FittedModel

PARAMS = ("r0", "asinh_gain", "log_tau", "log_beta", "log_sigma")
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
MAX_LIKELIHOOD_BINS = 120
MAX_GRID_POINTS = 500
# How far (fraction of the declared range) a curve's start or asymptote may sit outside it.
RANGE_SLACK = 0.02


@dataclass
class FinalReward:
    """Posterior predictive of the reward level at ``total_steps``."""

    samples: np.ndarray

    @property
    def mean(self) -> float:
        return float(np.mean(self.samples))

    def quantile(self, q: float | np.ndarray) -> float | np.ndarray:
        """Posterior quantile(s) of the final reward."""
        value = np.quantile(self.samples, q)
        return float(value) if np.ndim(value) == 0 else value

    def interval(self, mass: float = 0.9) -> tuple[float, float]:
        """Central credible interval holding ``mass`` of the posterior."""
        lo, hi = np.quantile(self.samples, [(1 - mass) / 2, (1 + mass) / 2])
        return float(lo), float(hi)


@dataclass
class Forecast:
    """Posterior trajectories of one run's expected reward, on the run's own scale.

    ``draws`` has shape (n_draws, len(steps)) and is the predictive of the reward
    level (curve plus model discrepancy); ``curves`` holds the same draws of the
    parametric curve alone (what the stopping rule judges gains on); ``observed_steps``/``observed_rewards``
    are what the forecast was conditioned on. ``params`` holds the per-draw curve
    parameters (normalised units) and ``plateau_step`` the step where each draw
    reaches 95% of its total gain.
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

    @property
    def last_observed_step(self) -> int | None:
        return int(self.observed_steps[-1]) if self.observed_steps.size else None

    @property
    def step_noise(self) -> np.ndarray:
        """Per-draw noise of one logged step, in reward units (the likelihood's, noise floor included)."""
        return step_noise(self.params["sigma"]) * self.prepared.unit

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
        quantiles = np.quantile(self.draws, QUANTILES, axis=0)
        frame = pd.DataFrame({"step": self.steps.astype(int), "mean": self.draws.mean(axis=0)})
        for q, row in zip(QUANTILES, quantiles):
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


class _PopulationPrior:
    """Population posterior predictive of one run's parameters: Normal per draw, mixed over draws."""

    def __init__(self, model: "FittedModel", prepared: PreparedRun, initial_z: float | None, rng: np.random.Generator, n_components: int = 128):
        pop = model.population_arrays()
        k = prepared.kind_index
        x, i = centred_size(prepared, model.config["size_centres"]), prepared.initial_cov
        gain_mu = pop["gain_mu"][k]
        gain_sd = pop["gain_sd"][k]
        families = model.families
        if prepared.family in families:
            f = families.index(prepared.family)
            fam_gain, fam_gain_var = pop["fam_gain"][f], 0.0
            fam_tau, fam_tau_var = pop["fam_tau"][f], 0.0
        else:
            fam_gain, fam_gain_var = 0.0, pop["fam_gain_sd"] ** 2
            fam_tau, fam_tau_var = 0.0, pop["fam_tau_sd"] ** 2
        start = initial_z if initial_z is not None else start_level(prepared)
        r0_sd = pop["r0_sd"][k]
        if initial_z is not None:
            r0_sd = np.minimum(r0_sd, 0.02 if prepared.kind == "range" else 0.1)
        n = gain_mu.size
        self.mean = np.stack(
            [
                np.full(n, start),
                gain_mu + gain_sd * (fam_gain + pop["gain_size"] * x + pop["gain_init"] * i),
                pop["tau_mu"] + fam_tau + pop["tau_size"] * x + pop["tau_init"] * i,
                pop["beta_mu"] if model.form != "exponential" else np.zeros(n),
                pop["sig_mu"][k],
            ],
            axis=1,
        )
        self.sd = np.stack(
            [
                r0_sd,
                gain_sd * np.sqrt(1.0 + fam_gain_var),
                np.sqrt(pop["tau_sd"] ** 2 + fam_tau_var),
                pop["beta_sd"] if model.form != "exponential" else np.full(n, 1e-9),
                pop["sig_sd"][k],
            ],
            axis=1,
        )
        self.components = rng.choice(n, size=min(n_components, n), replace=False)

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        rows = rng.integers(0, self.mean.shape[0], size)
        return self.mean[rows] + self.sd[rows] * rng.standard_normal((size, len(PARAMS)))

    def logpdf(self, theta: np.ndarray) -> np.ndarray:
        """Log density of the mixture (over a fixed random subset of posterior draws), by matrix products."""
        rows = self.components
        precision = 1.0 / self.sd[rows] ** 2
        mean = self.mean[rows]
        quad = (theta**2) @ precision.T - 2.0 * theta @ (mean * precision).T + np.sum(mean**2 * precision, axis=1)[None]
        log_norm = -np.sum(np.log(self.sd[rows]), axis=1) - 0.5 * len(PARAMS) * np.log(2 * np.pi)
        return logsumexp(log_norm[None] - 0.5 * quad, axis=1) - np.log(rows.size)


def _student_t_loglik(form: str, theta: np.ndarray, t: np.ndarray, z: np.ndarray, counts: np.ndarray, nu: float) -> np.ndarray:
    if t.size == 0:
        return np.zeros(theta.shape[0])
    r0, asinh_gain, log_tau, log_beta, log_sigma = (theta[:, j : j + 1] for j in range(len(PARAMS)))
    mu = reward_curve(form, t[None], r0, np.sinh(asinh_gain), np.exp(log_tau), np.exp(log_beta))
    scale = step_noise(np.exp(log_sigma)) / np.sqrt(counts)[None]
    resid = (z[None] - mu) / scale
    const = gammaln((nu + 1) / 2) - gammaln(nu / 2) - 0.5 * np.log(nu * np.pi)
    return np.sum(const - np.log(scale) - (nu + 1) / 2 * np.log1p(resid**2 / nu), axis=1)


def _ess(log_w: np.ndarray) -> float:
    w = np.exp(log_w - logsumexp(log_w))
    return float(1.0 / np.sum(w**2))


def condition(
    model: "FittedModel",
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
    prior = _PopulationPrior(model, prepared, prepared.initial_z, rng)
    t, z, counts = bin_observations(prepared.t, prepared.z, MAX_LIKELIHOOD_BINS)
    nu = float(model.config.get("student_nu", 4.0))

    def log_lik(theta: np.ndarray) -> np.ndarray:
        value = _student_t_loglik(model.form, theta, t, z, counts, nu)
        if prepared.kind == "range":
            # A declared reward range bounds where the curve can start and end.
            ends = np.stack([theta[:, 0], theta[:, 0] + np.sinh(theta[:, 1])])
            outside = np.any((ends < -RANGE_SLACK) | (ends > 1 + RANGE_SLACK), axis=0)
            value = np.where(outside, -np.inf, value)
        return value

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
    model: "FittedModel",
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

    For a run not yet started pass ``run=None`` with ``family``, ``params_b``,
    ``initial_reward``, ``total_steps`` and ``reward_range``. For logged runs
    keyword arguments override the run's metadata. ``drift`` (the Brownian
    discrepancy scale) defaults to the model's calibrated setting.
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
    r0, asinh_gain, log_tau, log_beta, log_sigma = sample.T
    gain, tau, beta = np.sinh(asinh_gain), np.exp(log_tau), np.exp(log_beta)

    total = prepared.total_steps
    last = int(prepared.steps[-1]) if prepared.steps.size else 0
    grid = _grid(last, total)
    t_grid = grid / total
    curves = reward_curve(model.form, t_grid[None], r0[:, None], gain[:, None], tau[:, None], beta[:, None])
    t_last = last / total
    drift = float(model.config.get("drift", 0.0) if drift is None else drift)
    levels = curves + _brownian_discrepancy(rng, t_grid, t_last, drift * np.exp(log_sigma)) if drift > 0 else curves
    current = reward_curve(model.form, np.array([t_last]), r0, gain, tau, beta) if last else r0
    plateau_t = plateau_progress(model.form, tau, beta)
    return Forecast(
        run_id=prepared.run_id,
        steps=grid,
        draws=prepared.to_reward(levels),
        curves=prepared.to_reward(curves),
        total_steps=total,
        observed_steps=prepared.steps.astype(int),
        observed_rewards=prepared.to_reward(prepared.z),
        params={"r0": r0, "gain": gain, "tau": tau, "beta": beta, "sigma": np.exp(log_sigma), "unit": prepared.unit},
        plateau_step=np.clip(plateau_t * total, 0, None),
        current=prepared.to_reward(np.asarray(current).ravel()),
        prepared=prepared,
        ess=float(1.0 / np.sum(np.exp(2 * log_w))),
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
