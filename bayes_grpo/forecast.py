"""Forecast a run's reward trajectory from the stored population posterior.

A forecast conditions one run on its logged steps without touching the
hierarchy: per-run parameters ``(r0, asinh gain, log tau, log beta, log sigma)`` are
drawn from the population posterior predictive for the run's covariates
(family, size, initial reward) and re-weighted by the likelihood of the run's
steps by importance sampling. Both densities come from the one model
definition in :mod:`bayes_grpo.population` (:class:`~bayes_grpo.population.RunPrior`,
:func:`~bayes_grpo.population.log_likelihood`); this module works on any
:class:`~bayes_grpo.population.PopulationPosterior` and does not import the
fitting code. :func:`condition` samples the prior (a mixture over a fixed
subset of population draws, the same for sampling and density, so weights are
exact), falls back to a Laplace/multivariate-t proposal and then to a
Metropolis-placed mixture when the weights degenerate, and measures every
attempt with Pareto-smoothed importance sampling (ArviZ): each forecast carries
its ESS and Pareto k-hat, and warns when they stay poor. This is a few
vectorised NumPy passes, fast enough to run inside a training loop, and the
prior component keeps the bimodal "took off / not yet" case that a Laplace
approximation alone would miss.

The run's prior is robust (:class:`RobustPrior`): the population predictive mixed with a
wide component, so a run whose steps the population cannot explain moves to its own
evidence, and :attr:`Forecast.outside_population` (with :attr:`Forecast.caveats`) says so.

Saturating curves bend where the population's runs bend. A run that keeps climbing
where its curve expected a bend carries on along its own trend instead: the
curve and a straight-line trend are both asked to forecast the last part of the log
from the steps before it (:func:`trend_weight`), and that share of the draws
continues from the last step along the log's recent slope (:func:`trend_paths`), which
decays slowly (:data:`TREND_HORIZON`). The stopping rule sees these draws in
:attr:`Forecast.curves`, so a run still rising is not called a plateau.

Trajectories carry a model-discrepancy term: beyond the last logged step the
forecast may wander from the parametric curve as a Brownian motion with scale
``drift * sigma`` per unit of progress, so intervals stay honest for runs whose
shape the curve form does not capture. Each draw's scale is multiplied by
``sqrt(df / chi2_df)`` (``ModelConfig.drift_df``, 2): the wander at any step is then
Student-t rather than Normal, mostly small with a few large departures, as real
runs' departures from a smooth curve are (a late take-off, a collapse).

:attr:`Forecast.final` is the posterior predictive of what
:func:`bayes_grpo.measures.final_reward` measures: the mean *logged* reward
over the final 10% of the run's logging steps, the noise of averaging those
steps included (:meth:`Forecast.window_reward`); :attr:`Forecast.level_at_end`
is the latent level at ``total_steps``. :attr:`Forecast.regimes` gives the
posterior weights of "take-off still ahead", "plateau" and "decline".
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import arviz as az
import numpy as np
import pandas as pd
import xarray as xr
from scipy.special import expit, gammaln

from bayes_grpo.config import ModelConfig
from bayes_grpo.curves import plateau_progress
from bayes_grpo.errors import ModelError
from bayes_grpo.logs import RunLog
from bayes_grpo.population import (
    PARAMS, PopulationPosterior, RunPrior, expected_reward, in_support, log_likelihood, logsumexp_rows, natural, step_noise,
)  # fmt: skip
from bayes_grpo.prepare import LONG_PLAN_FACTOR, PreparedRun, bin_observations, noise_scale, prepare_run
from bayes_grpo.measures import final_window_size, smoothed
from bayes_grpo.settings import FINAL_WINDOW_FRACTION, FORECAST_QUANTILES

MAX_GRID_POINTS = 500
#: Population posterior draws the forecast prior is a mixture over (for sampling and density alike).
PRIOR_COMPONENTS = 128
#: Prior weight of the wide component of a run's prior (:class:`RobustPrior`).
WIDE_SHARE = 0.1
#: How much wider than the population predictive the wide component is (its SDs are multiplied by this).
WIDE_SCALE = 2.5
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
#: :attr:`Forecast.caveats` says a run lies outside the population above this posterior weight of the wide component.
OUTSIDE_POPULATION_WARN = 0.5
#: Importance-sampling particles per proposal.
N_PARTICLES = 3000
#: Pareto k-hat above this: the importance weights are unreliable (Vehtari et al. 2024, JMLR 25(72)).
PARETO_K_MAX = 0.7
#: Weights whose ESS is below this share of the particles make the sampler try a better proposal.
MIN_ESS_FRACTION = 0.1
#: A forecast warns only when its best weights have k-hat above PARETO_K_MAX or fewer effective
#: particles than this (quantiles of fewer are too rough to trust).
MIN_ESS_WARN = 100
#: Share of every local proposal drawn from the prior (defensive importance sampling).
DEFENSIVE_SHARE = 0.2
#: Chains and steps of the Metropolis run that places the fallback proposal, and how many such rounds
#: (each starts from the best particles so far) are tried before giving up.
MCMC_CHAINS, MCMC_STEPS, MCMC_ROUNDS = 400, 30, 3
#: Kernels of the fallback mixture, and their width relative to the chains' spread.
MIXTURE_KERNELS, KERNEL_BANDWIDTH = 64, 0.6
#: A change of the reward level counts as material, for the regimes, beyond this many per-step noise SDs.
MATERIAL_NOISE = 1.0
#: Regimes reported by :attr:`Forecast.regimes`, in order.
REGIMES = ("take_off_ahead", "plateau", "decline")
# Second entry of the seed of the logging noise in Forecast.window_reward (apart from the sampler's streams).
_WINDOW_NOISE_STREAM = 2


@dataclass
class FinalReward:
    """Posterior predictive draws of one reward quantity (e.g. :attr:`Forecast.final`).

    Parameters
    ----------
    samples : ndarray
        Draws of the quantity, in the run's own reward scale.

    Example
    -------
    >>> final = FinalReward(np.array([0.4, 0.5, 0.6]))
    >>> round(final.mean, 2), final.quantile(0.5)
    (0.5, 0.5)
    """

    samples: np.ndarray

    @property
    def mean(self) -> float:
        """Posterior mean of the final reward (it follows a long upper tail of late take-offs)."""
        return float(np.mean(self.samples))

    @property
    def median(self) -> float:
        """Posterior median: the point forecast (the one absolute error calls for)."""
        return float(np.median(self.samples))

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
        Per-draw curve parameters ``r0, gain, tau, beta, sigma`` (normalised units; ``end_gain``, the
        gain by the end of the plan, for a model with ``gain_at="plan_end"``) and ``unit``.
    plateau_step : ndarray
        Per-draw step where the curve reaches 95% of its total gain.
    current : ndarray
        Per-draw expected reward at the last logged step.
    prepared : PreparedRun
        The normalised run.
    ess : float
        Effective sample size of the (Pareto-smoothed) importance weights the draws were resampled from.
    pareto_k : float
        Pareto k-hat of those weights (:func:`arviz.psislw`): above 0.7 they are unreliable
        (:func:`condition` then tried better proposals, and warned if none helped).
    proposal : str
        The proposal the weights came from: ``"prior"``, ``"laplace"`` or ``"mcmc"`` (see :func:`condition`).
    noise_floor : float
        The model's per-step noise floor (normalised units).
    trend_weight : float
        Share of the draws that carry on along the run's own recent trend after the last step
        instead of following the curve (:func:`trend_weight`).
    outside_population : float
        Posterior probability that the run lies outside what the population has seen: the weight
        of the wide component of its prior (:class:`RobustPrior`). Above
        :data:`OUTSIDE_POPULATION_WARN` the forecast leans on the run's own steps and is wider;
        :attr:`caveats` says so.
    seed : int
        Seed of the forecast; also fixes the logging noise drawn by :meth:`window_reward`.
    calibrated : bool
        Whether the draws went through the model's calibration layer (:mod:`bayes_grpo.recalibration`); the
        curves (what the stop rule judges) are the model's own.
    uses_signal : bool
        Whether the model reads GRPO's learning signal (``reward_std``, model 3.0; see
        :func:`bayes_grpo.prepare.learning_signal`), so that a log without it is worth a caveat.

    Example
    -------
    >>> fc = bg.default_model().forecast(run.head(100), total_steps=400)  # doctest: +SKIP
    >>> fc.final.quantile(0.5), fc.final.interval(0.9)  # doctest: +SKIP
    >>> fc.regimes["take_off_ahead"], fc.ess, fc.pareto_k  # doctest: +SKIP
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
    pareto_k: float = float("nan")
    proposal: str = ""
    noise_floor: float = ModelConfig.noise_floor
    trend_weight: float = 0.0
    outside_population: float = 0.0
    seed: int = 0
    uses_signal: bool = False
    calibrated: bool = False

    @property
    def caveats(self) -> list[str]:
        """Plain-language warnings about this forecast (empty when there are none).

        A run whose latest steps gave GRPO no learning signal (every group's completions
        scored the same: :attr:`~bayes_grpo.prepare.PreparedRun.signal_exhausted`), a log
        without the GRPO signals the model reads, a plan more than
        :data:`~bayes_grpo.prepare.LONG_PLAN_FACTOR` times the log, a run outside what the population has
        seen (:attr:`outside_population` above :data:`OUTSIDE_POPULATION_WARN`), and
        importance weights that stayed unreliable (Pareto k-hat above :data:`PARETO_K_MAX`, or
        fewer than :data:`MIN_ESS_WARN` effective draws).
        """
        notes = []
        prepared = self.prepared
        if prepared.signal_exhausted:
            notes.append(
                "GRPO has no learning signal left: over the last logged steps the completions of each group scored the same "
                "(reward_std 0 or frac_reward_zero_std 1), so this reward gives the policy no gradient and will not rise by itself"
            )
        missing = [name for name, value in (("reward_std", prepared.recent_reward_std), ("frac_reward_zero_std", prepared.recent_zero_share)) if not np.isfinite(value)]
        if self.uses_signal and prepared.steps.size and "reward_std" in missing:
            notes.append(
                f"the log has no {' or '.join(missing)}: the forecast cannot read how much the completions of a "
                "group still disagree (GRPO's learning signal) and is as wide as for a run whose signal is unknown"
            )
        if prepared.kind == "learned" and prepared.reward_ceiling is not None:
            notes.append(
                f"the rewards look like 0-or-{prepared.reward_ceiling:.2g} outcomes (reward_std^2 = reward x "
                f"({prepared.reward_ceiling:.2g} - reward) at every logged step with spread): the forecast stays within "
                f"0 to {prepared.reward_ceiling:.3g}; pass reward_range=(min, max) if that is wrong"
            )
        if self.observed_steps.size and self.total_steps > LONG_PLAN_FACTOR * self.observed_steps[-1]:
            notes.append(
                f"the planned {self.total_steps} steps are {self.total_steps / self.observed_steps[-1]:.0f} times the "
                f"{int(self.observed_steps[-1])} logged: the log shows nothing of where the plan ends, so the forecast of its "
                "end is the population's, hardly this run's"
            )
        if self.outside_population > OUTSIDE_POPULATION_WARN:
            notes.append(
                f"the logged steps lie outside what the fitted runs have shown (probability {self.outside_population:.2f}): "
                "the forecast leans on this run's own steps and its intervals are wider"
            )
        if self.pareto_k > PARETO_K_MAX:
            notes.append(f"the importance weights are unreliable (Pareto k-hat {self.pareto_k:.2f} > {PARETO_K_MAX}): the intervals may be too narrow")
        elif self.ess < MIN_ESS_WARN:
            notes.append(f"the forecast rests on about {self.ess:.0f} effective draws (fewer than {MIN_ESS_WARN}): its quantiles are rough")
        return notes

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
        """Mean logged reward over the final window, noise included: ``.mean``, ``.quantile(q)``, ``.interval``, ``.samples``.

        The final window is the last :data:`~bayes_grpo.settings.FINAL_WINDOW_FRACTION`
        (10%) of the steps the run is expected to log up to ``total_steps``
        (:meth:`final_window_steps`), and the quantity is :meth:`window_reward` of
        those steps: what :func:`bayes_grpo.measures.final_reward` measures on the
        finished run. The latent level at ``total_steps`` is :attr:`level_at_end`.
        """
        return self.window_reward(self.final_window_steps())

    @property
    def level_at_end(self) -> FinalReward:
        """The expected reward level (no logging noise) at ``total_steps``."""
        return FinalReward(self.draws[:, -1])

    @property
    def logging_interval(self) -> float:
        """Steps between logged rewards: the median spacing of the observed steps (1 with fewer than two)."""
        if self.observed_steps.size < 2:
            return 1.0
        return max(float(np.median(np.diff(self.observed_steps))), 1.0)

    def final_window_steps(self, fraction: float = FINAL_WINDOW_FRACTION) -> np.ndarray:
        """The steps the run is expected to log in its final window (the last ``fraction`` of its logged steps).

        The run logs every :attr:`logging_interval` steps up to ``total_steps``;
        the window holds :func:`bayes_grpo.measures.final_window_size` of those
        points, counted back from ``total_steps``.
        """
        interval = self.logging_interval
        n_logged = max(1, int(round(self.total_steps / interval)))
        size = final_window_size(n_logged, fraction)
        return np.clip(self.total_steps - interval * np.arange(size)[::-1], 1.0, None)

    def window_reward(self, steps: np.ndarray) -> FinalReward:
        """Posterior predictive of the mean logged reward at ``steps``, noise included.

        Per draw: the mean of the trajectory draw over ``steps`` plus Normal noise
        of SD ``step_noise / sqrt(len(steps))``, the noise of averaging that many
        logged rewards. The noise is fixed by the forecast's ``seed``, so repeated
        calls agree. Calibration scores this quantity on the real window's steps.

        Parameters
        ----------
        steps : array of int or float
            The logged steps averaged (at least one).

        Returns
        -------
        FinalReward
        """
        steps = np.atleast_1d(np.asarray(steps, dtype=float))
        if steps.size == 0:
            raise ModelError("window_reward needs at least one step")
        noise = np.random.default_rng([self.seed, _WINDOW_NOISE_STREAM]).standard_normal(self.draws.shape[0])
        samples = self.mean_over(self.draws, steps) + noise * self.step_noise / np.sqrt(steps.size)
        if self.prepared.bounds is not None:  # a mean of rewards inside the range they can take stays inside it
            samples = np.clip(samples, *self.prepared.bounds)
        return FinalReward(samples)

    @property
    def regimes(self) -> dict[str, float]:
        """Posterior weights of three regimes: ``take_off_ahead``, ``plateau`` and ``decline`` (they sum to 1).

        Judged per draw of the expected reward's smooth part (:attr:`curves`: the
        curve, or the run's own trend for the draws that follow it; neither the
        model-discrepancy wander nor logging noise), in units of that draw's per-step noise
        :attr:`step_noise`: a change beyond ``m = MATERIAL_NOISE`` (1) noise SD
        is *material*.

        * ``now``: the level at the last logged step;
        * ``window``: the mean level over :meth:`final_window_steps` (the
          latent part of :attr:`final`); ``rise ahead``: ``window - now``;
        * ``best``: the larger of ``now`` and the highest smoothed logged reward
          (:func:`bayes_grpo.measures.smoothed`, kernel SD
          :data:`~bayes_grpo.settings.SMOOTHING_BANDWIDTH` of the planned steps).

        A draw is in **decline** when ``window < best - m``: the final window
        sits materially below the best level reached so far. Otherwise it has a
        **take-off ahead** when ``rise ahead > m``: a material rise is still to
        come, whether the run takes off late or keeps climbing as it has. Otherwise
        it is a **plateau**: no material change is ahead. A run not yet started
        has no best.
        """
        levels = self.curves
        window = self.mean_over(levels, self.final_window_steps())
        if self.observed_steps.size:
            now = self.mean_over(levels, self.observed_steps[-1:].astype(float))
            span = max(float(self.total_steps - self.observed_steps[0]), float(self.observed_steps[-1] - self.observed_steps[0]), 1.0)
            best = np.maximum(now, float(np.max(smoothed(self.observed_steps, self.observed_rewards, span=span))))
        else:
            now = levels[:, 0]
            best = now
        material = MATERIAL_NOISE * self.step_noise
        ahead = window - now
        decline = window < best - material
        take_off = ~decline & (ahead > material)
        weights = (take_off.mean(), (~decline & ~take_off).mean(), decline.mean())
        return {name: float(w) for name, w in zip(REGIMES, weights)}

    def mean_over(self, values: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """Per-draw mean over ``steps`` of ``values`` (draws x :attr:`steps` grid, e.g. :attr:`draws` or
        :attr:`curves`), linearly interpolated between grid steps."""
        grid = self.steps
        if grid.size == 1:
            return values[:, 0].copy()
        right = np.clip(np.searchsorted(grid, steps), 1, grid.size - 1)
        left = right - 1
        frac = np.clip((steps - grid[left]) / (grid[right] - grid[left]), 0.0, 1.0)
        weights = np.zeros(grid.size)
        np.add.at(weights, left, 1.0 - frac)
        np.add.at(weights, right, frac)
        used = np.flatnonzero(weights)  # a window covers a few grid steps: weigh those columns only
        return (values[:, used] * (weights[used] / steps.size)).sum(axis=1)

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


@dataclass(frozen=True)
class Conditioning:
    """Weighted parameter particles of one run given its logged steps, and how trustworthy the weights are.

    Attributes
    ----------
    theta : ndarray
        (n_particles, len(PARAMS)) unconstrained parameters.
    log_weights : ndarray
        Pareto-smoothed (PSIS), normalised log importance weights.
    ess : float
        Effective sample size of the smoothed weights, ``1 / sum(w^2)``.
    pareto_k : float
        Estimated shape k-hat of the generalised Pareto fitted to the largest raw weights
        (:func:`arviz.psislw`): at most 0.7 the weighted estimates are reliable, above it not.
    proposal : str
        Which proposal made the particles: ``"prior"``, ``"laplace"`` or ``"mcmc"`` (see :func:`condition`).
    outside_population : float
        Posterior probability that the run's parameters come from the wide component of its prior
        (:class:`RobustPrior`): near 1 when the population cannot explain the logged steps.
    """

    theta: np.ndarray
    log_weights: np.ndarray
    ess: float
    pareto_k: float
    proposal: str
    outside_population: float = 0.0

    @property
    def reliable(self) -> bool:
        """k-hat at most :data:`PARETO_K_MAX` and ESS at least :data:`MIN_ESS_FRACTION` of the particles."""
        return bool(self.pareto_k <= PARETO_K_MAX and self.ess >= MIN_ESS_FRACTION * self.theta.shape[0])


def _smoothed(theta: np.ndarray, log_w: np.ndarray, proposal: str) -> Conditioning:
    """PSIS-smooth raw log weights (ArviZ) and measure them: ESS and Pareto k-hat."""
    with warnings.catch_warnings():  # ArviZ warns on a large k-hat; condition() decides what to do about it
        warnings.simplefilter("ignore")
        smoothed, k_hat = az.psislw(np.asarray(log_w, dtype=float))
    smoothed = np.asarray(smoothed, dtype=float)
    ess = float(1.0 / np.sum(np.exp(2.0 * smoothed)))
    return Conditioning(theta=theta, log_weights=smoothed, ess=ess, pareto_k=float(k_hat), proposal=proposal)


class _ThinnedPopulation:
    """A population posterior restricted to a subset of its draws (the forecast prior's mixture components).

    Everything but :meth:`population_arrays` (families, sources, size centres,
    settings) is the wrapped model's own.
    """

    def __init__(self, model: PopulationPosterior, picks: np.ndarray):
        self._model = model
        self._arrays = {name: values[..., picks] for name, values in model.population_arrays().items()}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def population_arrays(self) -> dict[str, np.ndarray]:
        return self._arrays


def _thinned(model: PopulationPosterior, rng: np.random.Generator, n_draws: int) -> PopulationPosterior:
    """``model`` with ``n_draws`` of its posterior draws picked at random (the sample axis is last)."""
    n_total = next(iter(model.population_arrays().values())).shape[-1]
    if n_total <= n_draws:
        return model
    return _ThinnedPopulation(model, np.sort(rng.choice(n_total, size=n_draws, replace=False)))


def condition(
    model: PopulationPosterior,
    prepared: PreparedRun,
    *,
    n_particles: int = N_PARTICLES,
    seed: int = 0,
) -> Conditioning:
    """Importance-sample the run's parameters given its steps, with PSIS diagnostics.

    The prior is the population posterior predictive of the run's parameters,
    mixed over :data:`PRIOR_COMPONENTS` posterior draws picked at random; the
    same draws serve to sample it and to evaluate its density, so every weight
    is exactly ``prior * likelihood / proposal``. Proposals, in turn, until the
    weights are reliable (Pareto k-hat <= :data:`PARETO_K_MAX` and ESS >=
    :data:`MIN_ESS_FRACTION` of the particles):

    1. ``"prior"``: particles from the prior, weighted by the likelihood; kept
       when the weights stay spread out (ESS >= 25% of the particles), as they
       do for runs with few steps.
    2. ``"laplace"``: a multivariate t around the posterior mode (BFGS from the
       best particles, finite-difference Hessian), mixed with the prior
       (defensive importance sampling keeps a "not taken off yet" mode that has
       mass), then refitted once to the weighted particles (moment matching).
    3. ``"mcmc"``: a short random-walk Metropolis run on the run's log posterior
       (:data:`MCMC_CHAINS` chains from the best particles so far, the step
       covariance adapted halfway) places a mixture of t kernels on the
       posterior's actual shape (curved or multimodal posteriors defeat the
       Laplace step); mixed with the prior, as in 2. Up to
       :data:`MCMC_ROUNDS` rounds, each starting from the best particles so far.

    The attempt with the best weights is returned (reliable first, then the
    largest ESS); a ``UserWarning`` says so when its k-hat is above
    :data:`PARETO_K_MAX` or it has fewer than :data:`MIN_ESS_WARN` effective particles.

    Parameters
    ----------
    model : PopulationPosterior
        The fitted population.
    prepared : PreparedRun
        The run, normalised.
    n_particles : int
        Particles per proposal.
    seed : int
        Seed of the prior's components and of every proposal.

    Returns
    -------
    Conditioning
        Particles, PSIS-smoothed log weights, ESS, k-hat and the proposal used.
    """
    best = _best_attempt(model, prepared, n_particles, seed)
    if best.pareto_k > PARETO_K_MAX or best.ess < MIN_ESS_WARN:
        warnings.warn(
            f"forecast of run {prepared.run_id!r}: the importance weights stay poor after every proposal "
            f"(ESS {best.ess:.0f} of {n_particles} particles, Pareto k-hat {best.pareto_k:.2f}, "
            f"proposal {best.proposal!r}); its intervals may be too narrow",
            UserWarning,
            stacklevel=3,
        )
    return best


class RobustPrior:
    """A run's prior: the population predictive (:class:`~bayes_grpo.population.RunPrior`) mixed with a wide component.

    The wide component is a Normal with the population predictive's mean and its
    standard deviations times ``scale``, with prior weight ``share``. A run that looks
    like the population's runs keeps the population's sharp prior (the wide component's
    marginal likelihood is lower), while a run whose logged steps the population cannot
    explain moves to its own evidence: the posterior weight of the wide component,
    :meth:`wide_share`, says how far outside the population the run lies (a robust
    meta-analytic prior, Schmidli et al. 2014, Biometrics 70(4)).
    """

    def __init__(self, population: RunPrior, share: float = WIDE_SHARE, scale: float = WIDE_SCALE):
        rows = population.components
        mean, sd = population.mean[rows], population.sd[rows]
        self.population = population
        self.share = float(share)
        self.wide_mean = mean.mean(axis=0)
        self.wide_sd = scale * np.sqrt(np.mean(sd**2, axis=0) + mean.var(axis=0))

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """``size`` parameter vectors (rows) from the mixture."""
        theta = self.population.sample(rng, size)
        wide = rng.random(size) < self.share
        theta[wide] = self.wide_mean + self.wide_sd * rng.standard_normal((int(wide.sum()), len(PARAMS)))
        return theta

    def _wide_logpdf(self, theta: np.ndarray) -> np.ndarray:
        z = (theta - self.wide_mean) / self.wide_sd
        return -0.5 * np.sum(z**2, axis=1) - np.sum(np.log(self.wide_sd)) - 0.5 * len(PARAMS) * np.log(2 * np.pi)

    def logpdf(self, theta: np.ndarray) -> np.ndarray:
        """Log density of the mixture."""
        if self.share <= 0:
            return self.population.logpdf(theta)
        return np.logaddexp(np.log1p(-self.share) + self.population.logpdf(theta), np.log(self.share) + self._wide_logpdf(theta))

    def wide_share(self, theta: np.ndarray) -> np.ndarray:
        """Per particle, the probability that it comes from the wide component (its responsibility)."""
        if self.share <= 0:
            return np.zeros(theta.shape[0])
        return np.exp(np.log(self.share) + self._wide_logpdf(theta) - self.logpdf(theta))


def _best_attempt(model: PopulationPosterior, prepared: PreparedRun, n_particles: int, seed: int) -> Conditioning:
    """The proposals of :func:`condition` in turn; the first reliable attempt, else the best one."""
    rng = np.random.default_rng(seed)
    config = model.model_config
    prior = RobustPrior(RunPrior(_thinned(model, rng, PRIOR_COMPONENTS), prepared, rng, n_components=PRIOR_COMPONENTS), WIDE_SHARE, WIDE_SCALE)
    t, z, counts = bin_observations(prepared.t, prepared.z, config.forecast_bins)

    def measured(attempt: Conditioning) -> Conditioning:
        return replace(attempt, outside_population=float(np.exp(attempt.log_weights) @ prior.wide_share(attempt.theta)))

    def log_lik(theta: np.ndarray) -> np.ndarray:
        # A declared reward range bounds where the curve can start and end.
        return np.where(in_support(config, theta, prepared.kind), log_likelihood(config, theta, t, z, counts), -np.inf)

    def log_post(theta: np.ndarray) -> np.ndarray:
        return log_lik(theta) + prior.logpdf(theta)

    theta = prior.sample(rng, n_particles)
    log_l = log_lik(theta)
    attempts = [_smoothed(theta, log_l, "prior")]
    if attempts[0].reliable and attempts[0].ess >= 0.25 * n_particles:
        return measured(attempts[0])

    fallback = _weighted_cov(theta, attempts[0].log_weights) + np.diag(np.full(len(PARAMS), 1e-4))
    mode, cov = _laplace(log_post, theta[np.argsort(log_l)[-2:]], fallback)
    for _ in range(2):
        n_local = int((1 - DEFENSIVE_SHARE) * n_particles)
        theta = np.vstack([_mvt_sample(rng, mode, cov, n_local), prior.sample(rng, n_particles - n_local)])
        log_prior = prior.logpdf(theta)
        log_q = np.logaddexp(np.log1p(-DEFENSIVE_SHARE) + _mvt_logpdf(theta, mode, cov), np.log(DEFENSIVE_SHARE) + log_prior)
        attempts.append(_smoothed(theta, log_prior + log_lik(theta) - log_q, "laplace"))
        if attempts[-1].reliable:
            return measured(attempts[-1])
        mode = np.exp(attempts[-1].log_weights) @ theta
        cov = _weighted_cov(theta, attempts[-1].log_weights) * 1.5 + np.diag(np.full(len(PARAMS), 1e-8))

    for _ in range(MCMC_ROUNDS):
        attempts.append(_mcmc_mixture(rng, prior, log_lik, log_post, max(attempts, key=_quality), n_particles))
        if attempts[-1].reliable:
            return measured(attempts[-1])
    return measured(max(attempts, key=_quality))


def _quality(attempt: Conditioning) -> tuple[bool, float, float]:
    """Order of preference between attempts: reliable first, then k-hat at most the limit, then the larger ESS."""
    return attempt.reliable, attempt.pareto_k <= PARETO_K_MAX, attempt.ess


def _weighted_cov(theta: np.ndarray, log_weights: np.ndarray) -> np.ndarray:
    """Covariance of the rows of ``theta`` under normalised log weights (no small-sample correction)."""
    weights = np.exp(log_weights)
    centred = theta - weights @ theta
    return (centred * weights[:, None]).T @ centred


def _mcmc_mixture(
    rng: np.random.Generator,
    prior: RobustPrior,
    log_lik: Callable[[np.ndarray], np.ndarray],
    log_post: Callable[[np.ndarray], np.ndarray],
    start: Conditioning,
    n_particles: int,
) -> Conditioning:
    """Particles from a mixture of t kernels placed by a short Metropolis run on the log posterior (step 3 of :func:`condition`)."""
    dim = len(PARAMS)
    jitter = np.diag(np.full(dim, 1e-8))
    chains = start.theta[_systematic_resample(np.exp(start.log_weights), MCMC_CHAINS, rng)]
    step_cov = _weighted_cov(start.theta, start.log_weights) + np.diag(np.full(dim, 1e-6))
    current = log_post(chains)
    for phase in range(2):
        chol = np.linalg.cholesky(step_cov * 2.38**2 / dim + jitter)
        for _ in range(MCMC_STEPS // 2):
            proposed = chains + rng.standard_normal(chains.shape) @ chol.T
            proposed_lp = log_post(proposed)
            accept = np.log(rng.random(MCMC_CHAINS)) < proposed_lp - current
            chains[accept], current[accept] = proposed[accept], proposed_lp[accept]
        step_cov = np.cov(chains.T) + jitter  # adapted to the chains for the second half
    centres = chains[rng.choice(MCMC_CHAINS, size=MIXTURE_KERNELS, replace=False)]
    kernel_cov = step_cov * KERNEL_BANDWIDTH**2
    n_local = int((1 - DEFENSIVE_SHARE) * n_particles)
    local = centres[rng.integers(0, MIXTURE_KERNELS, n_local)] + _mvt_sample(rng, np.zeros(dim), kernel_cov, n_local)
    theta = np.vstack([local, prior.sample(rng, n_particles - n_local)])
    log_prior = prior.logpdf(theta)
    log_q = np.logaddexp(np.log1p(-DEFENSIVE_SHARE) + _mvt_mixture_logpdf(theta, centres, kernel_cov), np.log(DEFENSIVE_SHARE) + log_prior)
    return _smoothed(theta, log_prior + log_lik(theta) - log_q, "mcmc")


_T_DF = 5.0
#: Steps of the Laplace proposal's finite-difference Hessian, tried in turn until all its points are finite.
HESSIAN_STEPS = (1e-3, 1e-4, 1e-5, 1e-6)


def _laplace(log_post: Any, starts: np.ndarray, fallback_cov: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mode of ``log_post`` (vectorised over rows) and a positive-definite inverse-Hessian covariance.

    Where the Hessian cannot be taken even with the smallest of :data:`HESSIAN_STEPS` (the mode
    sits on a boundary of the support, e.g. a declared reward range), ``fallback_cov`` is used instead.
    """
    from scipy.optimize import minimize

    dim, h = starts.shape[1], 1e-5
    steps = np.vstack([np.zeros(dim), np.eye(dim) * h, -np.eye(dim) * h])

    def objective(x: np.ndarray) -> tuple[float, np.ndarray]:
        # Value and central-difference gradient from one vectorised evaluation. A forward difference's
        # error (h times the curvature) exceeds gtol on a sharp posterior (a long log): BFGS then spent
        # over half its calls in line searches that could not make the gradient smaller.
        values = log_post(x[None] + steps)
        if not np.all(np.isfinite(values)):
            return 1e300, np.zeros(dim)
        return -values[0], -(values[1 : dim + 1] - values[dim + 1 :]) / (2 * h)

    best = min((minimize(objective, x0, jac=True, method="BFGS", options={"gtol": 1e-2, "maxiter": 40}) for x0 in starts), key=lambda r: r.fun)
    mode = best.x
    # A mode on (or within a step of) a boundary of the support has -inf neighbours: the Hessian is retaken
    # with steps ten times smaller until every point is inside (a run whose curve, extrapolated, would leave
    # its declared range sits there; the prior-particle covariance instead sent every proposal astray).
    for h in HESSIAN_STEPS:
        precision = _precision_at(log_post, mode, h)
        if np.all(np.isfinite(precision)):
            break
    else:
        return mode, fallback_cov
    eigval, eigvec = np.linalg.eigh(precision)
    eigval = np.clip(eigval, 1e-2, 1e8)
    cov = (eigvec / eigval) @ eigvec.T
    return mode, cov * 1.5


def _precision_at(log_post: Any, mode: np.ndarray, h: float) -> np.ndarray:
    """Minus the central-difference Hessian of ``log_post`` at ``mode`` with step ``h``, symmetrised (one vectorised call)."""
    dim = mode.size
    eye = np.eye(dim) * h
    points = [mode]
    for i in range(dim):
        for j in range(dim):
            points += [mode + eye[i] + eye[j], mode + eye[i] - eye[j], mode - eye[i] + eye[j], mode - eye[i] - eye[j]]
    with np.errstate(invalid="ignore"):  # -inf on a support boundary: the caller falls back
        values = log_post(np.array(points))
        hessian = np.empty((dim, dim))
        k = 1
        for i in range(dim):
            for j in range(dim):
                pp, pm_, mp, mm = values[k : k + 4]
                hessian[i, j] = (pp - pm_ - mp + mm) / (4 * h * h)
                k += 4
    return -(hessian + hessian.T) / 2


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


def _mvt_mixture_logpdf(x: np.ndarray, centres: np.ndarray, cov: np.ndarray) -> np.ndarray:
    """Log density of an equal-weight mixture of multivariate t kernels sharing ``cov``, one per row of ``centres``."""
    chol = np.linalg.cholesky(cov)
    x_w = np.linalg.solve(chol, x.T)  # whitened points (dim, n)
    c_w = np.linalg.solve(chol, centres.T)  # whitened centres (dim, m)
    maha = np.clip(np.sum(x_w**2, axis=0)[:, None] + np.sum(c_w**2, axis=0)[None] - 2.0 * np.einsum("ji,jk->ik", x_w, c_w), 0.0, None)  # not BLAS: no threads
    dim = centres.shape[1]
    log_norm = gammaln((_T_DF + dim) / 2) - gammaln(_T_DF / 2) - 0.5 * dim * np.log(_T_DF * np.pi) - np.sum(np.log(np.diag(chol)))
    return log_norm + logsumexp_rows(-(_T_DF + dim) / 2 * np.log1p(maha / _T_DF)) - np.log(centres.shape[0])


def forecast(
    model: PopulationPosterior,
    run: RunLog | None = None,
    total_steps: int | None = None,
    *,
    family: str | None = None,
    params_b: float | None = None,
    initial_reward: float | None = None,
    reward_range: tuple[float, float] | None = None,
    source: str | None = None,
    n_draws: int = 1000,
    drift: float | None = None,
    seed: int = 0,
    calibrated: bool = True,
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
    source : str, optional
        The run's source (repository / recipe / task; default: its ``source_repo`` metadata).
        A source the model was fitted on gives the run that source's effect; any other
        source, or none, the population level widened by the spread between sources.
    n_draws : int
        Trajectory draws returned (1000).
    drift : float, optional
        Scale of the Brownian discrepancy (default: ``model.model_config.drift``).
    seed : int
        Seed of the importance sampler and of the discrepancy paths.
    calibrated : bool
        Apply the model's calibration layer (:mod:`bayes_grpo.recalibration`), learned on held-out
        real runs, when it has one (default); False gives the model's raw forecast.

    Returns
    -------
    Forecast

    Raises
    ------
    ModelError
        When ``total_steps`` is unknown or smaller than the last logged step, or a run not yet
        started lacks ``initial_reward``/``reward_range``.

    Warns
    -----
    UserWarning
        When a run without a declared ``reward_range`` has only logged equal rewards (no scale to
        forecast a change in), when ``total_steps`` is more than :data:`LONG_PLAN_FACTOR` times the
        last logged step, and when the importance weights stay unreliable after every proposal of :func:`condition`
        (Pareto k-hat above 0.7 or ESS below 10% of the particles); ``Forecast.ess`` and
        ``Forecast.pareto_k`` always say how good they are.

    Example
    -------
    >>> fc = forecast(bg.default_model(), run.head(100), total_steps=400)  # doctest: +SKIP
    >>> fc.final.interval(0.9), fc.pareto_k, fc.regimes["take_off_ahead"]  # doctest: +SKIP
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
        source=source,
        unit_progress=model.model_config.unit_progress,
    )
    if prepared.steps.size and prepared.total_steps > LONG_PLAN_FACTOR * prepared.steps[-1]:
        warnings.warn(
            f"run {prepared.run_id!r}: total_steps={prepared.total_steps} is more than {LONG_PLAN_FACTOR} times the last logged "
            f"step {int(prepared.steps[-1])}: the forecast extrapolates far beyond what the log shows; check the planned length",
            UserWarning,
            stacklevel=2,
        )
    no_scale = prepared.kind == "learned" and prepared.z.size >= 3 and np.ptp(prepared.z) == 0.0
    if no_scale:
        warnings.warn(
            f"run {prepared.run_id!r}: the {prepared.z.size} rewards logged so far are all equal, so they give the "
            "forecast no reward scale and it shows no change; pass reward_range=(min, max) for one",
            UserWarning,
            stacklevel=2,
        )
    with warnings.catch_warnings():
        if no_scale:  # its weights cannot be good, and the warning above already says the forecast shows no change
            warnings.filterwarnings("ignore", message=".*importance weights stay poor")
        conditioned = condition(model, prepared, seed=seed)
    config = model.model_config
    rng = np.random.default_rng(seed + 1)
    picks = _systematic_resample(np.exp(conditioned.log_weights), n_draws, rng)
    sample = conditioned.theta[picks]
    p = natural(dict(zip(PARAMS, sample.T)), config)
    r0, tau, beta = p["r0"], p["tau"], p["beta"]

    total = prepared.total_steps
    last = int(prepared.steps[-1]) if prepared.steps.size else 0
    grid = _grid(last, total)
    t_grid = grid / total
    curves = expected_reward(config, t_grid[None], {name: value[:, None] for name, value in p.items()})
    t_last = last / total
    trend = trend_weight(model, prepared, conditioned) if prepared.steps.size else 0.0
    if trend > 0:
        curves = trend_paths(config, prepared, curves, t_grid, t_last, rng, trend)
    drift = float(config.drift if drift is None else drift)
    levels = curves + _brownian_discrepancy(rng, t_grid, t_last, drift * p["sigma"], config.drift_df) if drift > 0 else curves
    current = expected_reward(config, np.array([t_last]), p) if last else r0
    plateau_t = plateau_progress(config.form, tau, beta)
    draws, curves = prepared.to_reward(levels), prepared.to_reward(curves)
    # The layer calibrates what the forecast shows (the draws: intervals, final reward, fan charts). The stop rule
    # judges the remaining gain on the model's own curves: moved by the layer's long upper tail, no canonical
    # plateau, flat run or dip reached P(plateau) 0.99 any more (benchmarks/results/shapes.md).
    layer = getattr(model, "recalibration", None) if calibrated else None
    if layer is not None:
        draws = layer.apply(draws, prepared, grid)
    if prepared.bounds is not None:  # an expected reward cannot leave the range the reward functions can give
        draws, curves = np.clip(draws, *prepared.bounds), np.clip(curves, *prepared.bounds)
    return Forecast(
        run_id=prepared.run_id,
        steps=grid,
        draws=draws,
        curves=curves,
        total_steps=total,
        observed_steps=prepared.steps.astype(int),
        observed_rewards=prepared.to_reward(prepared.z),
        params={**p, "unit": prepared.unit},
        plateau_step=np.clip(plateau_t * total, 0, None),
        current=prepared.to_reward(np.asarray(current).ravel()),
        prepared=prepared,
        ess=conditioned.ess,
        pareto_k=conditioned.pareto_k,
        proposal=conditioned.proposal,
        noise_floor=config.noise_floor,
        trend_weight=trend,
        outside_population=conditioned.outside_population,
        seed=seed,
        uses_signal="gain_signal" in model.population_arrays(),
        calibrated=layer is not None,
    )


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
    recent, recent_cov = linear_trend(t_w, z_w, c_w, max(noise_scale(prepared.z), config.noise_floor))
    if recent[1] < TREND_CLEAR_SE * np.sqrt(recent_cov[1, 1]):
        return 0.0  # not clearly climbing now: there is no rise to carry on
    ll_w = log_likelihood(config, conditioned.theta, t_w, z_w, c_w)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a large k-hat only makes the comparison rougher
        without_window, _ = az.psislw(conditioned.log_weights - ll_w)
    curve = float(logsumexp_rows(np.asarray(without_window) + ll_w))

    t_e, z_e, c_e = bin_observations(earlier.t, earlier.z, config.forecast_bins)
    step_sd = max(noise_scale(prepared.z), config.noise_floor)
    tail = max(TREND_MIN_POINTS, min(t_e.size, t_w.size))
    mean, cov = _rising(*linear_trend(t_e[-tail:], z_e[-tail:], c_e[-tail:], step_sd))
    design = np.column_stack([np.ones_like(t_w), _decayed(t_w - t_e[-1])])
    own = _low_rank_normal_logpdf(z_w, design @ mean, step_sd**2 / c_w, design, cov)
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
    step_sd = max(noise_scale(prepared.z), config.noise_floor)
    mean, cov = _rising(*linear_trend(t, z, counts, step_sd))
    n = curves.shape[0]
    slopes = mean[1] + np.sqrt(cov[1, 1]) * rng.standard_normal(n)
    chosen = rng.random(n) < weight
    last = min(int(np.searchsorted(t_grid, t_last)), t_grid.size - 1)
    horizons = TREND_HORIZON * np.exp(TREND_HORIZON_SD * rng.standard_normal(n))
    path = curves[:, [last]] + slopes[:, None] * _decayed((t_grid - t_last)[None], horizons[:, None])
    return np.where(chosen[:, None] & (t_grid > t_last)[None], path, curves)


def _grid(last: int, total: int) -> np.ndarray:
    """Forecast steps: every step up to ``total`` (thinned to at most MAX_GRID_POINTS), always including ``last``."""
    grid = np.unique(np.linspace(1, total, min(total, MAX_GRID_POINTS)).round().astype(int))
    if last:
        grid = np.union1d(grid, [last])
    return grid.astype(float)


def _brownian_discrepancy(rng: np.random.Generator, t_grid: np.ndarray, t_last: float, scale: np.ndarray, df: float | None) -> np.ndarray:
    """Brownian paths that are zero up to ``t_last`` and wander with ``scale`` per unit progress after it.

    With ``df``, each path's scale is multiplied by ``sqrt(df / chi2_df)`` (a Student-t scale
    mixture: heavy-tailed departures); None keeps Normal paths.
    """
    if df is not None:
        scale = scale * np.sqrt(df / rng.chisquare(df, size=scale.size))
    ahead = np.clip(t_grid - t_last, 0, None)
    increments = np.diff(ahead, prepend=0.0)
    steps = rng.standard_normal((scale.size, t_grid.size)) * np.sqrt(increments)[None]
    return scale[:, None] * np.cumsum(steps, axis=1)


def _systematic_resample(weights: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    positions = (rng.random() + np.arange(n)) / n
    return np.minimum(np.searchsorted(np.cumsum(weights), positions), weights.size - 1)
