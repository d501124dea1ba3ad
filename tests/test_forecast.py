"""Forecasts with the shipped model: the final-window quantity, PSIS diagnostics and fallbacks, regimes.

Everything runs on the real shipped population posterior (``bg.default_model()``)
and on real runs (bundled in ``data/runs``, and the shared external runs when
``../shared/external_runs`` is present); no fitting, so these tests are quick.
"""

from __future__ import annotations

import dataclasses
import json
import warnings

import h5netcdf
import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.special import logsumexp
from scipy.stats import multivariate_normal, multivariate_t

import bayes_grpo as bg
from bayes_grpo import measures
from bayes_grpo.config import ModelConfig
from bayes_grpo.forecast import MIN_ESS_WARN, PARETO_K_MAX, PRIOR_COMPONENTS, REGIMES, Conditioning, condition
from bayes_grpo.forecast.conditioning import _mvt_mixture_logpdf, _thinned
from bayes_grpo.forecast.trend import _low_rank_normal_logpdf
from bayes_grpo.population import logsumexp_rows
from bayes_grpo.prepare import prepare_run
from bayes_grpo.settings import SMOOTHING_BANDWIDTH
from evaluation.settings import shared_runs_dir

PROPOSALS = {"prior", "laplace", "particles", "mcmc"}


@pytest.fixture(scope="module")
def model() -> bg.FittedModel:
    return bg.default_model()


@pytest.fixture(scope="module")
def bundled_run() -> bg.RunLog:
    """A bundled run logged at every step up to its planned end."""
    try:
        runs = bg.load_runs()
    except bg.LogError:
        pytest.skip("no bundled runs in data/runs")
    return next(r for r in runs if r.total_steps == r.last_step and np.all(np.diff(r.steps) == 1))


@pytest.fixture(scope="module")
def shared_runs() -> list[bg.RunLog]:
    """Up to six shared external runs (skips when ../shared/external_runs is absent)."""
    folder = shared_runs_dir()
    if folder is None:
        pytest.skip("../shared/external_runs is not present")
    return list(bg.load_runs(folder / "runs"))[:6]


def _log(rewards: np.ndarray, total: int, *, every: int = 1, reward_range: tuple[float, float] | None = (0.0, 1.0)) -> bg.RunLog:
    steps = every * np.arange(1, rewards.size + 1)
    frame = pd.DataFrame({"step": steps, "reward": rewards})
    return bg.read_log(frame, run_id="synthetic", family="qwen", params_b=0.5, total_steps=total, reward_range=reward_range)


def _quiet_forecast(model: bg.FittedModel, run: bg.RunLog, **kwargs) -> bg.Forecast:
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a poor-weights warning would fail the test
        warnings.filterwarnings("ignore", category=RuntimeWarning)  # overflow in far-out curve draws
        return model.forecast(run, **kwargs)


# ------------------------------------------------------------------ the final window


def test_final_is_the_mean_logged_reward_over_the_final_window_with_its_noise(model, bundled_run) -> None:
    run = bundled_run
    total = measures.horizon(run)
    fc = _quiet_forecast(model, measures.cut(run, 0.3), total_steps=total)
    # The window the forecast expects is the one the truth (measures.final_reward) averages.
    window = run.steps[-measures.final_window_size(len(run)) :]
    assert np.array_equal(fc.final_window_steps(), window)
    # The model's own forecast, per draw: the trajectory's mean over the window, plus noise of SD step_noise / sqrt(window
    # size); a calibrated forecast's final is that quantity moved by the layer (tests/test_recalibration.py).
    raw = fc.raw
    latent = np.array([np.interp(window, raw.steps, draw).mean() for draw in raw.draws])
    standardised = (raw.final.samples - latent) / (raw.step_noise / np.sqrt(window.size))
    assert abs(standardised.mean()) < 0.15 and 0.85 < standardised.std() < 1.15
    assert np.array_equal(fc.final.samples, fc.final.samples)  # the noise is fixed by the seed
    assert np.array_equal(fc.final.samples, fc.window_reward(window).samples)
    assert np.array_equal(fc.level_at_end.samples, fc.draws[:, -1])
    q05, q50, q95 = (fc.final.quantile(q) for q in (0.05, 0.5, 0.95))
    assert q05 < q50 < q95 and fc.final.interval(0.9) == pytest.approx((q05, q95))
    assert q05 < fc.final.mean < q95


def test_final_window_follows_the_logging_interval(model) -> None:
    rng = np.random.default_rng(3)
    run = _log(0.3 + 0.02 * rng.standard_normal(30), total=400, every=5)
    fc = _quiet_forecast(model, run)
    window = fc.final_window_steps()
    # 400 steps logged every 5 steps: 80 points, the last 8 of them.
    assert fc.logging_interval == 5 and np.array_equal(window, np.arange(365, 401, 5))
    single = _quiet_forecast(model, run.head(5))
    assert single.logging_interval == 1 and single.final_window_steps().size == 40


def test_window_reward_noise_shrinks_with_the_window(model, bundled_run) -> None:
    fc = _quiet_forecast(model, measures.cut(bundled_run, 0.5)).raw  # the model's own (the layer then moves the samples)
    last = float(fc.total_steps)
    one, many = fc.window_reward([last]), fc.window_reward(np.full(100, last))
    assert np.allclose(one.samples - fc.level_at_end.samples, 10 * (many.samples - fc.level_at_end.samples))
    with pytest.raises(bg.ModelError, match="at least one step"):
        fc.window_reward([])


def test_fewer_particles_and_a_coarser_grid_give_the_same_final_within_monte_carlo_noise(model, bundled_run) -> None:
    """The precision knobs rank uses: the grid holds at most grid_points steps (and the last logged one), and the final
    reward keeps its quantiles (the window interpolates between grid steps); values too small are refused."""
    head = measures.cut(bundled_run, 0.4)
    full = _quiet_forecast(model, head, seed=1)
    coarse = _quiet_forecast(model, head, seed=2, n_draws=500, n_particles=1500, grid_points=60)
    assert coarse.steps.size <= 61 and head.last_step in coarse.steps and coarse.draws.shape == (500, coarse.steps.size)
    width = np.subtract(*full.final.interval(0.9)[::-1])
    quantiles = [0.05, 0.5, 0.95]
    np.testing.assert_allclose(np.quantile(coarse.final.samples, quantiles), np.quantile(full.final.samples, quantiles), atol=0.1 * width)
    for name, value in (("n_particles", 99), ("grid_points", 1), ("n_draws", 1.5), ("n_draws", True)):
        with pytest.raises(bg.ModelError, match=f"{name} must be a whole number"):
            model.forecast(head, **{name: value})


# ------------------------------------------------------------------ importance sampling


def test_forecasts_of_real_runs_report_reliable_psis_diagnostics(model, shared_runs) -> None:
    for run in shared_runs:
        for fraction in (0.2, 0.3, 0.5):
            fc = _quiet_forecast(model, measures.cut(run, fraction), total_steps=measures.horizon(run))
            assert 0 < fc.ess <= 3000 and np.isfinite(fc.pareto_k), run.run_id
            assert fc.pareto_k <= PARETO_K_MAX and fc.proposal in PROPOSALS, run.run_id


def test_conditioning_weights_are_pareto_smoothed_and_measured(model, bundled_run) -> None:
    conditioned = condition(model, prepare_run(measures.cut(bundled_run, 0.3)), seed=4)
    weights = np.exp(conditioned.log_weights)
    assert weights.sum() == pytest.approx(1.0)
    assert conditioned.ess == pytest.approx(1.0 / np.sum(weights**2))
    assert conditioned.reliable == (conditioned.pareto_k <= PARETO_K_MAX and conditioned.ess >= 300)
    fc = _quiet_forecast(model, measures.cut(bundled_run, 0.3), seed=4)
    assert (fc.ess, fc.pareto_k, fc.proposal) == (conditioned.ess, conditioned.pareto_k, conditioned.proposal)


def test_the_prior_samples_and_evaluates_the_same_population_draws(model, bundled_run) -> None:
    rng = np.random.default_rng(0)
    full = model.population_arrays()
    thinned = _thinned(model, rng, PRIOR_COMPONENTS).population_arrays()
    assert all(values.shape[-1] == PRIOR_COMPONENTS for values in thinned.values())
    # Each kept draw is one of the model's draws, whole: every variable comes from the same draw.
    for k in range(0, PRIOR_COMPONENTS, 16):
        (draw,) = np.flatnonzero(full["fam_gain_sd"] == thinned["fam_gain_sd"][k])
        assert all(np.array_equal(thinned[name][..., k], values[..., draw]) for name, values in full.items())
    assert _thinned(model, rng, 10**9) is model


def test_fallback_mixture_density_is_normalised() -> None:
    rng = np.random.default_rng(1)
    centres = rng.standard_normal((4, 3))
    cov = np.array([[1.0, 0.3, 0.0], [0.3, 0.5, 0.1], [0.0, 0.1, 0.2]])
    x = rng.standard_normal((50, 3)) * 2
    expected = logsumexp([multivariate_t(loc=c, shape=cov, df=5).logpdf(x) for c in centres], axis=0) - np.log(4)
    assert np.allclose(_mvt_mixture_logpdf(x, centres, cov), expected)


def test_the_fast_densities_match_scipy() -> None:
    """The trend's low-rank Normal (also with a singular slope covariance) and the NumPy logsumexp agree with SciPy."""
    rng = np.random.default_rng(3)
    factor = np.column_stack([np.ones(40), np.sqrt(np.linspace(0.01, 1, 40))])
    noise_var = rng.uniform(0.5, 2.0, 40) * 1e-3
    x, mean = rng.standard_normal(40) * 0.1, rng.standard_normal(40) * 0.1
    for cov in (np.array([[2e-3, -1e-3], [-1e-3, 4e-3]]), np.diag([2e-3, 0.0])):
        expected = multivariate_normal.logpdf(x, mean, factor @ cov @ factor.T + np.diag(noise_var))
        assert _low_rank_normal_logpdf(x, mean, noise_var, factor, cov) == pytest.approx(expected, rel=1e-10)
    values = np.vstack([rng.standard_normal(7) * 300, np.full(7, -np.inf), np.r_[np.full(6, -np.inf), 2.0]])
    np.testing.assert_allclose(logsumexp_rows(values), logsumexp(values, axis=1), rtol=1e-12)


def _sharp_curved_run() -> bg.RunLog:
    """2,000 steps of a near-noiseless square-root climb: a narrow, curved posterior the Laplace step misses."""
    rng = np.random.default_rng(0)
    return _log(0.1 + 0.5 * np.sqrt(np.linspace(0, 1, 2000)) + 0.001 * rng.standard_normal(2000), total=4000)


def test_a_sharp_curved_posterior_falls_back_to_the_mcmc_proposal(monkeypatch) -> None:
    # On the population's prior alone (no wide component, which takes most of this too-clean run's weight).
    monkeypatch.setattr("bayes_grpo.forecast.conditioning.WIDE_SHARE", 0.0)
    model = bg.default_model()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        conditioned = condition(model, prepare_run(_sharp_curved_run()), seed=0)
    assert conditioned.proposal == "mcmc" and conditioned.reliable


def _weighted_moments(conditioned: Conditioning) -> tuple[np.ndarray, np.ndarray]:
    weights = np.exp(conditioned.log_weights)
    mean = weights @ conditioned.theta
    return mean, np.sqrt(weights @ (conditioned.theta - mean) ** 2)


def test_kernels_on_the_weighted_particles_take_a_posterior_the_laplace_step_just_misses(monkeypatch) -> None:
    """A noisy 1,000-step log-logistic rise, half of its plan: both Laplace proposals stay just short of reliable, and
    kernels on their weighted particles give the posterior the Metropolis fallback gives, at a tenth of its cost."""
    rng = np.random.default_rng(1)
    gain, tau, shape = rng.uniform(0.2, 1.2), rng.uniform(0.1, 0.6), rng.uniform(1.5, 4.0)
    t = np.arange(1, 1001) / 2000
    rewards = 0.1 + gain / (1.0 + (tau / t) ** shape) + 0.08 * rng.standard_t(4, t.size)
    prepared = prepare_run(_log(rewards, total=2000, reward_range=None))
    model = bg.default_model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        by_particles = condition(model, prepared, seed=0)
        monkeypatch.setattr("bayes_grpo.forecast.conditioning.PARTICLE_ROUNDS", 0)
        by_metropolis = condition(model, prepared, seed=0)
    assert (by_particles.proposal, by_metropolis.proposal) == ("particles", "mcmc") and by_particles.reliable
    (mean, sd), (reference_mean, reference_sd) = _weighted_moments(by_particles), _weighted_moments(by_metropolis)
    assert np.all(np.abs(mean - reference_mean) < 0.3 * reference_sd) and np.all((sd > 0.8 * reference_sd) & (sd < 1.25 * reference_sd))


def test_a_posterior_mode_on_the_declared_range_boundary_still_conditions_reliably() -> None:
    """A near-noiseless quadratic climb whose curve, extrapolated to the planned end, would leave its declared
    range: the mode sits on the range's edge, where the Laplace step's first Hessian has -inf points."""
    rng = np.random.default_rng(0)
    rewards = 0.1 + 0.5 * np.linspace(0, 1, 2000) ** 2 + 0.001 * rng.standard_normal(2000)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        conditioned = condition(bg.default_model(), prepare_run(_log(rewards, total=3000)), seed=0)
    assert conditioned.reliable and conditioned.proposal != "prior"


def test_weights_that_stay_poor_warn() -> None:
    model = bg.default_model()
    prepared = prepare_run(_sharp_curved_run())
    outcomes = []
    # Too few particles for this narrow posterior: with the shipped model 20 always stay poor, 30 never do.
    for n_particles, seed in [(n, seed) for n in (20, 30) for seed in range(4)]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            conditioned = condition(model, prepared, n_particles=n_particles, seed=seed)
        warned = [w for w in caught if "importance weights stay poor" in str(w.message)]
        assert bool(warned) == (conditioned.pareto_k > PARETO_K_MAX or conditioned.ess < MIN_ESS_WARN)
        outcomes.append(conditioned.reliable)
    assert any(outcomes) and not all(outcomes)  # some particle counts are enough for this posterior, some not


def test_reliability_needs_both_k_hat_and_ess() -> None:
    theta = np.zeros((1000, 5))
    assert Conditioning(theta, np.zeros(1000), 500.0, 0.5, "prior").reliable
    assert not Conditioning(theta, np.zeros(1000), 500.0, 0.8, "prior").reliable
    assert not Conditioning(theta, np.zeros(1000), 50.0, 0.5, "prior").reliable


# ------------------------------------------------------------------ regimes


def _regimes_by_definition(fc: bg.Forecast) -> dict[str, float]:
    """The regime weights recomputed from the docstring's definitions, step by step."""
    window = fc.final_window_steps()
    first, last = float(fc.observed_steps[0]), float(fc.observed_steps[-1])
    levels = fc.curves + np.reshape(fc.departure, (-1, 1))  # each curve where the run is: moved by its departure
    level_window = np.array([np.interp(window, fc.steps, d).mean() for d in levels])
    now = np.array([np.interp(last, fc.steps, d) for d in levels])
    span = max(fc.total_steps - first, last - first, 1.0)
    kernel = np.exp(-0.5 * ((fc.observed_steps[:, None] - fc.observed_steps[None, :]) / (SMOOTHING_BANDWIDTH * span)) ** 2)
    best = np.maximum(now, np.max(kernel @ fc.observed_rewards / kernel.sum(axis=1)))
    material = fc.step_noise
    decline = level_window < best - material
    take_off = ~decline & (level_window - now > material)
    return {"take_off_ahead": take_off.mean(), "plateau": 1 - take_off.mean() - decline.mean(), "decline": decline.mean()}


def test_regimes_follow_their_definitions(model, bundled_run) -> None:
    for fraction in (0.2, 0.5):
        fc = _quiet_forecast(model, measures.cut(bundled_run, fraction))
        assert tuple(fc.regimes) == REGIMES and sum(fc.regimes.values()) == pytest.approx(1.0)
        expected = _regimes_by_definition(fc)
        assert all(fc.regimes[name] == pytest.approx(expected[name], abs=1e-9) for name in REGIMES)


def test_a_flat_head_has_its_take_off_ahead_and_a_plateaued_run_does_not(model) -> None:
    rng = np.random.default_rng(0)
    t = np.arange(1, 201) / 200
    flat_rewards = 0.1 + 0.03 * rng.standard_normal(200)
    plateaued_rewards = 0.1 + 0.6 * (1 - np.exp(-t / 0.05)) + 0.03 * rng.standard_normal(200)
    # On a learned scale the population is the real runs', which often take off after a flat start.
    flat = _quiet_forecast(model, _log(flat_rewards, total=200, reward_range=None).head(40))
    plateaued = _quiet_forecast(model, _log(plateaued_rewards, total=200, reward_range=None).head(100))
    assert flat.regimes["take_off_ahead"] > 0.3 and plateaued.regimes["take_off_ahead"] < 0.05
    assert plateaued.regimes["plateau"] > 0.7
    # On a declared range it is the bundled CPU runs', which stay flat when flat at 20% of the run
    # (102 of the 164 are, and 3 of those rise by more than a fifth of the range later): small rises
    # may lie ahead, a rise of a fifth of the range rarely.
    flat_on_range = _quiet_forecast(model, _log(flat_rewards, total=200).head(40), calibrated=False)
    assert np.mean(flat_on_range.final.samples > 0.1 + 0.2) < 0.1
    # The calibration layer, learned on real runs whose flat heads did take off, widens that upper tail within the range.
    calibrated = _quiet_forecast(model, _log(flat_rewards, total=200).head(40))
    assert calibrated.final.quantile(0.95) >= flat_on_range.final.quantile(0.95) and calibrated.final.samples.max() <= 1.0


def test_a_run_that_fell_from_its_peak_is_in_decline(model) -> None:
    rng = np.random.default_rng(0)
    t = np.arange(1, 201) / 200
    # Up to 0.7 by 10% of the run, down to 0.3 by 20%, and flat there until the cut at 50%.
    level = 0.1 + np.interp(t, [0, 0.1, 0.2, 1], [0, 0.6, 0.2, 0.2])
    fc = _quiet_forecast(model, _log(level + 0.03 * rng.standard_normal(200), total=200, reward_range=None).head(100))
    assert fc.regimes["decline"] > 0.85 and fc.regimes["take_off_ahead"] < 0.1


def test_a_run_falling_steadily_after_its_rise_is_in_decline(model) -> None:
    # Up to 0.7, then a steady fall from 45% of the plan (to 0.4 at its end), cut at 70%: the forecast starts from
    # where the run has fallen to, and so do its regimes (judged on the curves alone: decline 0, plateau 1).
    rng = np.random.default_rng(0)
    t = np.arange(1, 251) / 250
    level = 0.1 + 0.6 * (1 - np.exp(-t / 0.08)) - 0.3 * np.clip(t - 0.45, 0, None) / 0.55
    fc = _quiet_forecast(model, _log(level + 0.03 * rng.standard_normal(250), total=250, reward_range=None).head(175))
    assert fc.regimes["decline"] > 0.5 and fc.final.quantile(0.5) < 0.65, fc.regimes
    assert any("does not carry the fall on" in note for note in fc.caveats)
    rising = _quiet_forecast(model, _log(level + 0.03 * rng.standard_normal(250), total=250, reward_range=None).head(100))
    assert not any("fall" in note for note in rising.caveats)  # cut at 40%, before the fall


def test_a_run_not_yet_started_has_no_rise_so_far(model) -> None:
    fc = _quiet_forecast(model, None, total_steps=300, initial_reward=0.1, reward_range=(0.0, 1.0))
    assert sum(fc.regimes.values()) == pytest.approx(1.0) and fc.regimes["decline"] <= 0.5
    assert fc.final_window_steps().size == 30 and np.isfinite(fc.final.mean)


# ------------------------------------------------------------------ the model discrepancy


def test_the_discrepancy_is_heavy_tailed_with_drift_df_and_normal_without(model, bundled_run) -> None:
    """Same draws of the curve, same drift: Student-t paths (df 2) have far heavier tails relative to their centre."""
    head = bundled_run.head(int(bundled_run.last_step * 0.3))
    spreads = {}
    for df in (None, 2.0):
        config = dataclasses.replace(model.model_config, drift=3.0, drift_df=df)
        fc = _quiet_forecast(dataclasses.replace(model, model_config=config), head, n_draws=4000, seed=3, calibrated=False)
        wander = fc.draws[:, -1] - fc.curves[:, -1]
        q = np.quantile(wander, [0.01, 0.25, 0.75, 0.99])
        spreads[df] = (q[2] - q[1], q[3] - q[0])
    # 98% range over interquartile range: about 3.4 for Normal paths, about 8.5 for Student-t(2).
    assert spreads[2.0][1] / spreads[2.0][0] > 1.5 * spreads[None][1] / spreads[None][0]


def test_model_files_without_drift_df_keep_normal_paths(tmp_path, model) -> None:
    """A model file written before drift_df existed is read with Normal paths, as it was fitted and calibrated."""
    path = model.save(tmp_path / "old.nc", full=False)
    with h5netcdf.File(path, "a") as handle:
        handle.attrs.pop("recalibration", None)  # such a file had no calibration layer ...
        handle.attrs.pop("sweep_coupling", None)  # ... and no stored sweep coupling
        config = json.loads(handle.attrs["model_config"])
        config.pop("drift_df")
        handle.attrs["model_config"] = json.dumps(config)
    assert bg.load_model(path).model_config.drift_df is None
    with pytest.raises(bg.ModelError, match="drift_df"):
        ModelConfig(drift_df=0)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    log10_units=st.floats(min_value=-5.0, max_value=4.0),
    offset=st.floats(min_value=-1e3, max_value=1e3),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_forecasts_follow_a_change_of_reward_units_and_offset(model, log10_units, offset, seed) -> None:
    """``a * reward + b`` is forecast as ``a * forecast + b`` (and decided alike) whatever the units:
    no absolute floor may set the scale of a run without a declared range."""
    rng = np.random.default_rng(seed)
    rewards = 0.2 + 0.6 / (1 + np.exp(-(np.arange(60) - 40) / 6)) + rng.normal(0, 0.05, 60)
    units = 10.0**log10_units

    def quantiles(values: np.ndarray) -> tuple[np.ndarray, float]:
        run = _log(values, total=200, reward_range=None)
        fc = _quiet_forecast(model, run, total_steps=200)
        return fc.final.quantile(np.array([0.05, 0.5, 0.95])), model.stop_decision(run, total_steps=200).probability

    base, p_base = quantiles(rewards)
    scaled, p_scaled = quantiles(units * rewards + offset)
    np.testing.assert_allclose((scaled - offset) / units, base, atol=1e-4 * np.ptp(rewards) + 1e-9 * abs(offset) / units)
    assert p_scaled == pytest.approx(p_base, abs=0.01)


def test_equal_rewards_without_a_declared_range_warn_that_there_is_no_scale(model) -> None:
    run = _log(np.full(20, 0.25), total=200, reward_range=None)
    with pytest.warns(UserWarning, match="all equal"):
        fc = model.forecast(run, total_steps=200)
    assert fc.final.quantile(0.95) == pytest.approx(0.25, abs=1e-6)
