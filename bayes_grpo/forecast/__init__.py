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
runs' departures from a smooth curve are (a late take-off, a collapse). The wander is there before the cut
too: each draw starts it from its departure at the last logged step, filtered from the log's residuals
from its curve (:func:`_departure_now`), so a run that has already moved off its curve (a second climb
under way) is forecast from where it is.

:attr:`Forecast.final` is the posterior predictive of what
:func:`bayes_grpo.measures.final_reward` measures: the mean *logged* reward
over the final 10% of the run's logging steps, the noise of averaging those
steps included (:meth:`Forecast.window_reward`); :attr:`Forecast.level_at_end`
is the latent level at ``total_steps``. :attr:`Forecast.regimes` gives the
posterior weights of "take-off still ahead", "plateau" and "decline".
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from bayes_grpo.config import ModelConfig
from bayes_grpo.curves import plateau_progress
from bayes_grpo.errors import ModelError
from bayes_grpo.forecast.conditioning import (
    DEFENSIVE_SHARE, MIN_ESS_FRACTION, MIN_ESS_WARN, N_PARTICLES, PARETO_K_MAX, PRIOR_COMPONENTS, WIDE_SCALE, WIDE_SHARE, Conditioning,
    RobustPrior, _systematic_resample, condition, condition_many, warn_if_poor,
)  # fmt: skip
from bayes_grpo.forecast.result import MATERIAL_NOISE, OUTSIDE_POPULATION_WARN, REGIMES, FinalReward, Forecast, within_shared_ceiling
from bayes_grpo.forecast.trend import (
    TREND_CLEAR_SE, TREND_HORIZON, TREND_HORIZON_SD, TREND_MIN_POINTS, TREND_PRIOR, TREND_PRIOR_SD, TREND_WINDOW, linear_trend,
    step_noise_sd, trend_paths, trend_weight,
)  # fmt: skip
from bayes_grpo.logs import RunLog
from bayes_grpo.population import PARAMS, PopulationPosterior, expected_reward, natural
from bayes_grpo.prepare import LONG_PLAN_FACTOR, PreparedRun, bin_observations, prepare_run

__all__ = [
    "DEFENSIVE_SHARE", "MATERIAL_NOISE", "MAX_GRID_POINTS", "MIN_ESS_FRACTION", "MIN_ESS_WARN", "N_PARTICLES", "OUTSIDE_POPULATION_WARN",
    "PARETO_K_MAX", "PRIOR_COMPONENTS", "REGIMES", "TREND_CLEAR_SE", "TREND_HORIZON", "TREND_HORIZON_SD", "TREND_MIN_POINTS",
    "TREND_PRIOR", "TREND_PRIOR_SD", "TREND_WINDOW", "WIDE_SCALE", "WIDE_SHARE", "Conditioning", "FinalReward", "Forecast",
    "RobustPrior", "condition", "condition_many", "forecast", "forecast_many", "linear_trend", "trend_paths", "trend_weight", "within_shared_ceiling",
]  # fmt: skip


MAX_GRID_POINTS = 500


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
    n_particles: int = N_PARTICLES,
    grid_points: int = MAX_GRID_POINTS,
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
    n_particles : int
        Importance-sampling particles per proposal (:func:`condition`): precision against speed.
    grid_points : int
        Most steps of the forecast grid (:attr:`Forecast.steps`; the last logged step is added): the
        trajectories' resolution against speed. The final window's reward interpolates between grid steps.

    Returns
    -------
    Forecast

    Raises
    ------
    ModelError
        When ``total_steps`` is unknown or smaller than the last logged step, a run not yet
        started lacks ``initial_reward``/``reward_range``, or ``n_draws`` (at least 2), ``n_particles``
        (at least 100) or ``grid_points`` (at least 2) is not a whole number that large.

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
    _check_precision(n_draws, n_particles, grid_points)
    prepared, no_scale = _prepared(model, run, total_steps, family, params_b, initial_reward, reward_range, source)
    conditioned = condition_many(model, [prepared], n_particles=n_particles, seeds=[seed])[0]
    if not no_scale:  # a run with no scale cannot have good weights, and its own warning says it shows no change
        warn_if_poor(conditioned, prepared, n_particles)
    return _forecast_conditioned(model, prepared, conditioned, n_draws, drift, seed, calibrated, grid_points)


def forecast_many(
    model: PopulationPosterior,
    runs: Sequence[RunLog],
    total_steps: int | None = None,
    *,
    seeds: Sequence[int],
    family: str | None = None,
    params_b: float | None = None,
    n_draws: int = 1000,
    calibrated: bool = True,
    n_particles: int = N_PARTICLES,
    grid_points: int = MAX_GRID_POINTS,
    n_jobs: int | None = None,
) -> list[Forecast]:
    """:func:`forecast` of several runs, each with its own seed: the forecasts of one call per run (to rounding), made faster together.

    The runs' posterior modes are searched in one batched optimisation (:func:`condition_many`); the rest of each
    forecast goes to ``n_jobs`` threads (joblib). :func:`bayes_grpo.sweeps.rank` forecasts a sweep's runs this way.

    Parameters
    ----------
    model : PopulationPosterior
        A fitted population.
    runs : sequence of RunLog
        The runs' logged steps so far.
    total_steps, family, params_b : optional
        Override every run's metadata, as in :func:`forecast`.
    seeds : sequence of int
        One seed per run (:func:`forecast`'s ``seed``).
    n_draws, calibrated, n_particles, grid_points
        As in :func:`forecast`.
    n_jobs : int, optional
        Threads the per-run work goes to (the result does not depend on it); default one per CPU core, at most one per run.

    Returns
    -------
    list of Forecast
        In the order of ``runs``.

    Raises
    ------
    ModelError
        As :func:`forecast`, and when ``seeds`` does not give one seed per run.
    """
    from joblib import Parallel, delayed

    _check_precision(n_draws, n_particles, grid_points)
    if len(seeds) != len(runs):
        raise ModelError(f"forecast_many needs one seed per run: got {len(seeds)} seeds for {len(runs)} runs")
    n_jobs = max(1, min(len(runs), os.cpu_count() or 1) if n_jobs is None else n_jobs)
    prepared = [_prepared(model, run, total_steps, family, params_b, None, None, None, stacklevel=3) for run in runs]
    conditioned = condition_many(model, [p for p, _ in prepared], n_particles=n_particles, seeds=seeds, n_jobs=n_jobs)
    for (run_prepared, no_scale), run_conditioned in zip(prepared, conditioned):
        if not no_scale:
            warn_if_poor(run_conditioned, run_prepared, n_particles)
    return list(
        Parallel(n_jobs=n_jobs, require="sharedmem")(
            delayed(_forecast_conditioned)(model, p, c, n_draws, None, seed, calibrated, grid_points)
            for (p, _), c, seed in zip(prepared, conditioned, seeds)
        )
    )


def _check_precision(n_draws: int, n_particles: int, grid_points: int) -> None:
    for name, value, least in (("n_draws", n_draws, 2), ("n_particles", n_particles, 100), ("grid_points", grid_points, 2)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < least:
            raise ModelError(f"{name} must be a whole number of at least {least}, got {value!r}")


def _prepared(
    model: PopulationPosterior,
    run: RunLog | None,
    total_steps: int | None,
    family: str | None,
    params_b: float | None,
    initial_reward: float | None,
    reward_range: tuple[float, float] | None,
    source: str | None,
    stacklevel: int = 3,
) -> tuple[PreparedRun, bool]:
    """The run prepared for its forecast, and whether its log gives no scale (each with its warning)."""
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
            stacklevel=stacklevel,
        )
    no_scale = prepared.kind == "learned" and prepared.z.size >= 3 and np.ptp(prepared.z) == 0.0
    if no_scale:
        metric = str(getattr(run, "metric", "reward"))
        logged = "rewards" if metric == "reward" else f"values of {metric}"
        warnings.warn(
            f"run {prepared.run_id!r}: the {prepared.z.size} {logged} logged so far are all equal, so they give the "
            f"forecast no {'reward ' if metric == 'reward' else ''}scale and it shows no change; pass reward_range=(min, max) for one",
            UserWarning,
            stacklevel=stacklevel,
        )
    return prepared, no_scale


def _forecast_conditioned(
    model: PopulationPosterior,
    prepared: PreparedRun,
    conditioned: Conditioning,
    n_draws: int,
    drift: float | None,
    seed: int,
    calibrated: bool,
    grid_points: int,
) -> Forecast:
    """The forecast of a run from its conditioned parameters: trajectory draws, the trend, the discrepancy and the layer."""
    config = model.model_config
    rng = np.random.default_rng(seed + 1)
    picks = _systematic_resample(np.exp(conditioned.log_weights), n_draws, rng)
    sample = conditioned.theta[picks]
    p = natural(dict(zip(PARAMS, sample.T)), config)
    r0, tau, beta = p["r0"], p["tau"], p["beta"]

    total = prepared.total_steps
    last = int(prepared.steps[-1]) if prepared.steps.size else 0
    grid = _grid(last, total, grid_points)
    t_grid = grid / total
    curves = expected_reward(config, t_grid[None], {name: value[:, None] for name, value in p.items()})
    t_last = last / total
    trend = trend_weight(model, prepared, conditioned) if prepared.steps.size else 0.0
    if trend > 0:
        curves = trend_paths(config, prepared, curves, t_grid, t_last, rng, trend)
    drift = float(config.drift if drift is None else drift)
    levels, departure = curves, np.zeros(n_draws)
    if drift > 0:
        if prepared.steps.size:  # the wander starts from where the run is at the cut
            departure = _departure_now(config, prepared, p, drift * p["sigma"], rng)
            levels = levels + (t_grid >= t_last)[None] * departure[:, None]
        levels = levels + _brownian_discrepancy(rng, t_grid, t_last, drift * p["sigma"], config.drift_df)
    current = expected_reward(config, np.array([t_last]), p) if last else r0
    plateau_t = plateau_progress(config.form, tau, beta)
    draws, curves = prepared.to_reward(levels), prepared.to_reward(curves)
    if prepared.bounds is not None:  # an expected reward cannot leave the range the reward functions can give
        curves = np.clip(curves, *prepared.bounds)
    with np.errstate(over="ignore"):  # a plateau beyond any horizon stays inf
        plateau_step = np.clip(plateau_t * total, 0, None)
    raw = Forecast(
        run_id=prepared.run_id,
        steps=grid,
        draws=draws,
        curves=curves,
        total_steps=total,
        observed_steps=prepared.steps.astype(int),
        observed_rewards=prepared.to_reward(prepared.z),
        params={**p, "unit": prepared.unit},
        plateau_step=plateau_step,
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
        departure=prepared.unit * departure,
    )
    # The layer calibrates what the forecast shows (the draws: intervals, final reward, fan charts), from the model's
    # own forecast (its draws and its weight of a take-off ahead). The stop rule judges the remaining gain on the
    # model's own curves (moved by the layer's long upper tail, no canonical plateau, flat run or dip reached
    # P(plateau) 0.99 any more: benchmarks/results/shapes.md) and a dip's recovery on the model's own draws.
    layer = getattr(model, "recalibration", None) if calibrated else None
    if layer is None and prepared.bounds is None:
        return raw
    shown = layer.apply(draws, prepared, grid, take_off=raw.regimes["take_off_ahead"]) if layer is not None else draws
    if prepared.bounds is not None:
        shown = np.clip(shown, *prepared.bounds)
    return replace(raw, draws=shown, layer=layer, raw_draws=draws)


def _grid(last: int, total: int, points: int = MAX_GRID_POINTS) -> np.ndarray:
    """Forecast steps: every step up to ``total`` (thinned to at most ``points``), always including ``last``."""
    grid = np.unique(np.linspace(1, total, min(total, points)).round().astype(int))
    if last:
        grid = np.union1d(grid, [last])
    return grid.astype(float)


def _departure_now(
    config: ModelConfig, prepared: PreparedRun, params: Mapping[str, np.ndarray], scale: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Each draw's departure from its curve at the last logged step, drawn from a Kalman filter of the log's residuals.

    The discrepancy the forecast lets wander after the cut (:func:`_brownian_discrepancy`, ``scale`` per unit
    progress) is there before it too: where the logged rewards have moved off the curve by the cut (a second climb
    under way, a collapse), the future starts from where the run is, not from where the curve is. The residuals of
    the (binned) log from each draw's curve are filtered as a random walk of that scale seen through the log's own
    step noise (:func:`~bayes_grpo.forecast.trend.step_noise_sd`), innovations clipped at 3 SDs (the likelihood is
    Student-t for the same reason: one wild batch does not move the level). A curve that runs through the recent steps keeps
    a departure near 0. Without it a run mid-way up a second climb was forecast at its first plateau's level
    (the ``two_stage`` shape at 70% of its plan: median 0.48, last logged rewards about 0.75).
    """
    t, z, counts = bin_observations(prepared.t, prepared.z, config.forecast_bins)
    curve = expected_reward(config, t[None], {name: np.asarray(value)[:, None] for name, value in params.items()})
    step_var = step_noise_sd(config, prepared) ** 2
    rate = np.asarray(scale, dtype=float) ** 2
    mean, var = np.zeros(rate.size), np.zeros(rate.size)  # the curve's start is the run's: no departure at progress 0
    previous = 0.0
    for j in range(t.size):
        var = var + rate * (t[j] - previous)
        total = var + step_var / counts[j]
        gain = var / total
        limit = 3.0 * np.sqrt(total)
        mean = mean + gain * np.clip(z[j] - curve[:, j] - mean, -limit, limit)
        var = (1.0 - gain) * var
        previous = t[j]
    return mean + np.sqrt(var) * rng.standard_normal(rate.size)


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
