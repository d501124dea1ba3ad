"""Forecasts that follow the run's own evidence: a rise that carries on, and a prior that gives way."""

from __future__ import annotations

import numpy as np
import pytest

import bayes_grpo as bg
from bayes_grpo import measures
from bayes_grpo.forecast import OUTSIDE_POPULATION_WARN, RobustPrior, linear_trend, trend_paths
from bayes_grpo.population import PARAMS, RunPrior
from bayes_grpo.prepare import prepare_run
from evaluation import shapes


@pytest.fixture(scope="module")
def model() -> bg.FittedModel:
    return bg.default_model()


def _truth_and_forecast(model: bg.FittedModel, shape: str, fraction: float, total: int = 2000, noise: float = 0.03):
    run = shapes.make_run(shape, total, noise, seed=0)
    return measures.final_reward(run.rewards), model.forecast(run.head(int(fraction * total)), total_steps=total, seed=0)


def test_a_run_still_climbing_at_the_cut_is_forecast_to_keep_climbing(model: bg.FittedModel) -> None:
    truth, fc = _truth_and_forecast(model, "straight", 0.5)
    lo, hi = fc.final.interval(0.9)
    assert fc.trend_weight > 0.5, fc.trend_weight
    assert fc.regimes["plateau"] < 0.5, fc.regimes
    assert lo <= truth <= hi, (truth, lo, hi)


def test_a_run_that_has_levelled_off_keeps_to_its_curve(model: bg.FittedModel) -> None:
    truth, fc = _truth_and_forecast(model, "early_plateau", 0.5)
    lo, hi = fc.final.interval(0.9)
    assert fc.trend_weight < 0.5, fc.trend_weight
    assert fc.regimes["plateau"] > 0.5, fc.regimes
    assert lo <= truth <= hi, (truth, lo, hi)


def test_the_fitted_trend_recovers_a_known_slope() -> None:
    t = np.linspace(0.2, 0.5, 60)
    z = 1.0 + 2.0 * (t - t[-1]) + np.random.default_rng(0).normal(0, 0.05, t.size)
    mean, cov = linear_trend(t, z, np.ones_like(t), step_sd=0.05)
    assert mean == pytest.approx([1.0, 2.0], abs=4 * np.sqrt(np.diag(cov)).max())
    assert cov[1, 1] < 0.1


def test_a_falling_run_is_not_carried_down_by_its_trend(model: bg.FittedModel) -> None:
    run = shapes.make_run("rise_decline", 2000, 0.03, seed=0)
    prepared = prepare_run(run.head(1600), total_steps=2000)
    t_grid = np.linspace(0, 1, 201)[1:]
    curves = np.tile(np.linspace(0, 1, 200), (50, 1))  # any curve draws: the trend draws start from their level now
    paths = trend_paths(model.model_config, prepared, curves, t_grid, 0.8, np.random.default_rng(0), weight=1.0)
    after = t_grid > 0.8
    now = curves[:, [np.searchsorted(t_grid, 0.8)]]
    assert np.all(paths[:, after] >= now - 1e-12)


def test_a_run_the_population_cannot_explain_moves_to_the_wide_prior_and_says_so(model: bg.FittedModel) -> None:
    # A near-noiseless climb: per-step noise of 0.001 of a 0.5 rise, far below any fitted run's.
    rewards = 0.1 + 0.5 * np.sqrt(np.linspace(0, 1, 600)) + 0.001 * np.random.default_rng(0).standard_normal(600)
    run = bg.RunLog("too-clean", __import__("pandas").DataFrame({"step": np.arange(1, 601), "reward": rewards}), bg.RunMetadata())
    fc = model.forecast(run, total_steps=1200, seed=0)
    assert fc.outside_population > OUTSIDE_POPULATION_WARN
    assert any("outside what the fitted runs have shown" in note for note in fc.caveats)


def test_a_typical_bundled_run_stays_with_the_population(model: bg.FittedModel) -> None:
    run = bg.load_runs()[0]
    fc = model.forecast(run.head(len(run) // 2), total_steps=run.total_steps or run.last_step, seed=0)
    assert fc.outside_population < OUTSIDE_POPULATION_WARN
    assert not any("outside" in note for note in fc.caveats)


def test_the_robust_prior_samples_what_its_density_describes(model: bg.FittedModel) -> None:
    rng = np.random.default_rng(0)
    prepared = prepare_run(bg.load_runs()[0])
    prior = RobustPrior(RunPrior(model, prepared, rng, n_components=64), share=0.3, scale=2.5)
    theta = prior.sample(rng, 20000)
    # The wide component's responsibility averages its prior weight over the prior's own draws.
    assert prior.wide_share(theta).mean() == pytest.approx(0.3, abs=0.02)
    assert theta.shape == (20000, len(PARAMS)) and np.all(np.isfinite(prior.logpdf(theta)))


def test_the_cli_says_when_a_run_lies_outside_the_population(tmp_path, capsys) -> None:
    from bayes_grpo.cli import main

    rewards = 0.1 + 0.5 * np.sqrt(np.linspace(0, 1, 600)) + 0.001 * np.random.default_rng(0).standard_normal(600)
    log = tmp_path / "too_clean.csv"
    log.write_text("step,reward\n" + "".join(f"{step},{reward}\n" for step, reward in zip(range(1, 601), rewards)))
    assert main(["forecast", str(log), "--total-steps", "1200"]) == 0
    out = capsys.readouterr().out
    assert "note: the logged steps lie outside what the fitted runs have shown" in out
    assert "draws following the run's own trend" in out


def test_a_run_that_has_moved_off_its_curve_is_forecast_from_where_it_is(model: bg.FittedModel) -> None:
    # Mid-way up a second climb the curve that fits the whole log sits at the first plateau (about 0.47); the
    # departure filtered from the log's residuals starts the future at the run's level now (about 0.75).
    run = shapes.make_run("two_stage", 2000, 0.03, seed=0)
    head = run.head(1400)
    fc = model.forecast(head, total_steps=2000, seed=0, calibrated=False)
    level_now = measures.persistence(head.rewards)
    after = np.median(fc.draws[:, np.searchsorted(fc.steps, 1400) + 1])
    curve_after = np.median(fc.curves[:, np.searchsorted(fc.steps, 1400) + 1])
    assert curve_after < level_now - 0.15, (curve_after, level_now)
    assert abs(after - level_now) < 0.05, (after, level_now)


def test_a_run_on_its_curve_keeps_its_forecast_centred_there(model: bg.FittedModel) -> None:
    run = shapes.make_run("early_plateau", 2000, 0.03, seed=0)
    fc = model.forecast(run.head(1000), total_steps=2000, seed=0, calibrated=False)
    gap = np.median(fc.draws[:, -1] - fc.curves[:, -1])  # the wander and the departure now: centred on the curve
    assert abs(gap) < 0.02, gap


def test_a_log_that_no_longer_moves_is_forecast_at_its_level_not_at_its_first_steps(model: bg.FittedModel) -> None:
    # flat_no_signal logs exactly 0.2 from 10% of its plan on; a departure filter that remembered its noisy first
    # steps put the forecast 0.002-0.004 off 0.2, outside an interval 0.001 wide.
    for total in (250, 2000):
        run = shapes.make_run("flat_no_signal", total, 0.08, seed=1)
        fc = model.forecast(run.head(total // 2), total_steps=total, seed=0, calibrated=False)
        assert abs(np.median(fc.draws[:, -1]) - 0.2) < 1e-3, total
