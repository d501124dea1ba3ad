"""GRPO's learning signal (``reward_std``) read from the log, in the forecast, in the stop rule, in the fit's units."""

from __future__ import annotations

import json

import h5netcdf
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bayes_grpo as bg
from bayes_grpo import measures
from bayes_grpo.population import MODEL_VERSION, covariates
from bayes_grpo.prepare import LONG_PLAN_FACTOR, SIGNAL_CLIP, frozen_after_start, learning_signal, prepare_run, training_horizon
from evaluation import shapes


def _run(rewards: np.ndarray, spreads: np.ndarray | None, total: int = 200, zero_share: np.ndarray | None = None) -> bg.RunLog:
    table = pd.DataFrame({"step": np.arange(1, rewards.size + 1), "reward": rewards})
    if spreads is not None:
        table["reward_std"] = spreads
    if zero_share is not None:
        table["frac_reward_zero_std"] = zero_share
    return bg.RunLog("signal-run", table, bg.RunMetadata(total_steps=total))


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    scale=st.floats(1e-3, 1e3),
    offset=st.floats(-100.0, 100.0),
    level=st.floats(0.01, 2.0),
)
def test_signal_is_the_same_in_any_reward_units(seed, scale, offset, level):
    """The signal relates the completions' spread to the rewards' own spread: units and offsets cancel."""
    rng = np.random.default_rng(seed)
    rewards = 0.3 + 0.1 * rng.standard_normal(120)
    spreads = level * (1.0 + 0.1 * rng.standard_normal(120)) ** 2
    steps = np.arange(1, 121)
    base = learning_signal(steps, rewards, spreads, 300)
    moved = learning_signal(steps, scale * rewards + offset, scale * spreads, 300)
    assert np.isfinite(base) and abs(base) <= SIGNAL_CLIP
    assert moved == pytest.approx(base, abs=1e-6)


def test_signal_reads_only_the_first_fifth_of_the_plan():
    rng = np.random.default_rng(0)
    rewards = 0.3 + 0.05 * rng.standard_normal(200)
    early = np.full(200, 0.2)
    late = early.copy()
    late[40:] = 0.0  # what happens after 20% of a 200-step plan does not change the covariate
    steps = np.arange(1, 201)
    assert learning_signal(steps, rewards, early, 200) == learning_signal(steps, rewards, late, 200)
    assert np.isnan(learning_signal(steps, rewards, None, 200))
    assert np.isnan(learning_signal(steps, rewards, np.full(200, np.nan), 200))


def test_more_spread_among_completions_is_more_signal():
    rng = np.random.default_rng(1)
    rewards = 0.3 + 0.05 * rng.standard_normal(100)
    steps = np.arange(1, 101)
    values = [learning_signal(steps, rewards, np.full(100, s), 100) for s in (0.0, 0.01, 0.1, 0.4)]
    assert values == sorted(values) and values[0] == -SIGNAL_CLIP


def test_a_log_without_reward_std_is_marginalised_and_said():
    model = bg.default_model()
    rng = np.random.default_rng(2)
    rewards = 0.2 + 0.3 * (1 - np.exp(-np.arange(60) / 30)) + 0.02 * rng.standard_normal(60)
    with_std = prepare_run(_run(rewards, np.full(60, 0.3)))
    without = prepare_run(_run(rewards, None))
    assert with_std.has_signal and not without.has_signal
    cov = covariates(without, model.size_centres, model.families, model.sources)
    assert cov.signal == 0.0 and cov.signal_known == 0.0
    fc = model.forecast(_run(rewards, None), seed=0)
    assert any("no reward_std" in note for note in fc.caveats)
    assert not any("reward_std" in note for note in model.forecast(_run(rewards, np.full(60, 0.3)), seed=0).caveats)


def test_flat_head_with_signal_has_a_higher_upper_quantile_than_without():
    """The directional check of issue 36: one flat head, reward_std high versus near 0."""
    model = bg.default_model()
    rng = np.random.default_rng(3)
    rewards = 0.2 + 0.03 * rng.standard_normal(90)
    live = model.forecast(_run(rewards, np.full(90, 0.45), total=300), seed=0)
    idle = model.forecast(_run(rewards, np.full(90, 0.002), total=300), seed=0)
    assert live.final.quantile(0.95) > idle.final.quantile(0.95) + 0.02


def test_flat_head_signal_reaches_the_forecast_through_the_callback_as_through_read_log():
    """The live path reads log_history with the loaders' parser, so reward_std moves the callback's forecast too."""
    from transformers import TrainerState

    from bayes_grpo.callback import PlateauStoppingCallback

    rng = np.random.default_rng(3)
    rewards = 0.2 + 0.03 * rng.standard_normal(90)
    q95 = {}
    for spread in (0.45, 0.01):
        state = TrainerState(global_step=90, max_steps=300)
        state.log_history = [{"step": i + 1, "reward": float(r), "reward_std": spread, "loss": 0.1} for i, r in enumerate(rewards)]
        callback = PlateauStoppingCallback(model=bg.default_model(), n_draws=1000)
        _, fc = callback._decide(state)
        assert fc.prepared.has_signal
        q95[spread] = fc.final.quantile(0.95)
        direct = bg.default_model().forecast(_run(rewards, np.full(90, spread), total=300), seed=90)
        assert fc.final.quantile(0.95) == pytest.approx(direct.final.quantile(0.95), rel=1e-6)
    assert q95[0.45] > q95[0.01] + 0.05


def test_a_head_window_unit_is_the_same_in_the_fit_as_at_any_cut_from_the_window_on():
    """ModelConfig.unit_progress: a finished run and the same run cut at 20, 30 or 50% share loc and unit."""
    rng = np.random.default_rng(5)
    steps = np.arange(1, 301)
    rewards = 0.1 + 0.6 / (1 + np.exp(-(steps - 150) / 20)) + 0.02 * rng.standard_normal(300)
    run = _run(rewards, np.full(300, 0.3), total=300)
    whole = prepare_run(run, unit_progress=0.2)
    for share in (0.2, 0.3, 0.5):
        cut = prepare_run(run.head(int(share * 300)), unit_progress=0.2)
        assert (cut.loc, cut.unit, cut.signal) == pytest.approx((whole.loc, whole.unit, whole.signal))
    assert whole.z.max() > 5  # the late rise is many head units
    # The default normalises on every logged step: a whole run's rise is about one unit.
    assert prepare_run(run).z.max() < 1.5


def test_a_plan_hundreds_of_times_the_log_is_fitted_as_its_logged_shape():
    short = _run(np.linspace(0, 1, 200), None, total=200 * LONG_PLAN_FACTOR + 1)
    assert training_horizon(short) == (200, True)
    assert training_horizon(_run(np.linspace(0, 1, 200), None, total=200 * LONG_PLAN_FACTOR)) == (200 * LONG_PLAN_FACTOR, False)
    unplanned = bg.RunLog("u", pd.DataFrame({"step": np.arange(1, 51), "reward": np.linspace(0, 1, 50)}), bg.RunMetadata())
    assert training_horizon(unplanned) == (50, True)


def test_a_run_frozen_after_its_first_steps_is_left_out_of_a_fit_with_a_warning(few_runs):
    frozen = _run(np.r_[np.linspace(-0.7, -1, 5), np.full(95, -1.0)], None, total=100)
    assert frozen_after_start(frozen) and not frozen_after_start(few_runs[0])
    with pytest.warns(UserWarning, match="1 run\\(s\\) left out of the fit: their reward never changes"):
        model = bg.fit([*few_runs[:2], frozen], draws=20, tune=20, chains=1, progressbar=False, keep_full=False)
    assert model.fitted_on["n_runs"] == 2


def test_a_run_without_learning_signal_is_stopped_and_told_why():
    model = bg.default_model()
    head = measures.cut(shapes.make_run("flat_no_signal", 250, 0.03, 0), 0.5)
    fc = model.forecast(head, seed=0)
    assert fc.prepared.signal_exhausted
    assert any("no learning signal" in note for note in fc.caveats)
    decision = model.stop_decision(head, seed=0)
    assert decision.should_stop and decision.reason == "no_signal"
    assert "no learning signal" in decision.explain() and decision.reward_std == 0.0
    # Before the stop rule's minimum fraction it waits, as for every other reason.
    assert model.stop_decision(measures.cut(shapes.make_run("flat_no_signal", 250, 0.03, 0), 0.2), seed=0).reason == "early"


def test_zero_share_alone_marks_a_run_without_signal():
    rewards = np.full(80, 0.4)
    zero = np.ones(80)
    run = _run(rewards, np.full(80, 0.3), zero_share=zero)  # a batch-wide spread (TRL 1.x) with no group spread
    assert prepare_run(run).signal_exhausted
    zero[-3:] = 0.5
    assert not prepare_run(_run(rewards, np.full(80, 0.3), zero_share=zero)).signal_exhausted


def test_a_sustained_stretch_without_group_spread_ends_learning_whatever_the_batch_mean_does():
    """150 steps with reward_std 0 and frac_reward_zero_std 1 while the batch mean jitters by 0.02: no signal left."""
    rng = np.random.default_rng(0)
    rewards = 0.5 + 0.02 * rng.standard_normal(150)
    assert prepare_run(_run(rewards, np.zeros(150), zero_share=np.ones(150))).signal_exhausted


def test_a_chance_streak_in_small_groups_is_judged_by_its_length():
    """One small group a step: 58% of steps have no spread by chance, so a streak of 10 is not the end of learning;
    a streak long enough that chance would hardly ever give it is, and the rewards may jump meanwhile."""
    rng = np.random.default_rng(1)
    quiet = rng.random(200) < 0.58
    rewards = np.where(rng.random(200) < 0.3, 2.0, 0.0)
    short, long = quiet.copy(), quiet.copy()
    short[-11], short[-10:] = False, True
    long[-41], long[-40:] = False, True
    assert not prepare_run(_run(rewards, np.where(short, 0.0, 1.0), total=200)).signal_exhausted
    assert prepare_run(_run(rewards, np.where(long, 0.0, 1.0), total=200)).signal_exhausted


def test_a_streak_is_judged_against_every_rate_the_steps_before_leave_plausible():
    """2 quiet steps of 3, then 28 quiet ones: the 3 steps cannot rule out that quiet steps are the norm in this log
    (a streak that long turns up by chance with probability 0.023), so learning goes on; after 20 steps with signal,
    the same streak is its end. An upper bound of the quiet rate at 80% (0.80) put the first at 0.008 and stopped it."""
    rewards = np.where(np.random.default_rng(2).random(48) < 0.5, 2.0, 0.0)
    for signalled_first, exhausted in ((np.array([True, True, False]), False), (np.zeros(20, bool), True)):
        quiet = np.r_[signalled_first, np.ones(28, bool)]
        run = _run(rewards[: quiet.size], np.where(quiet, 0.0, 1.414), total=300)
        assert prepare_run(run).signal_exhausted is exhausted


def test_plentiful_signal_is_named_when_the_run_goes_on():
    model = bg.default_model()
    head = measures.cut(shapes.make_run("flat_signal", 250, 0.03, 0), 0.3)
    decision = model.stop_decision(head, seed=0)
    assert not decision.should_stop
    assert "not a plateau" in decision.explain() and "reward_std" in decision.explain()


def test_shapes_log_grpo_signals_that_follow_the_rise_ahead():
    std, zero = shapes.learning_signal("late_60", np.array([0.2, 0.5, 0.99]))
    assert std[0] == pytest.approx(shapes.GROUP_SPREAD) and std[2] < 0.1 * shapes.GROUP_SPREAD
    assert np.allclose(std / shapes.GROUP_SPREAD + zero, 1.0)
    std, _ = shapes.learning_signal("rise_decline", np.array([0.7]))
    assert std[0] == pytest.approx(shapes.GROUP_SPREAD * shapes.IDLE_SHARE)  # nothing better ahead: idle groups only
    run = shapes.make_run("flat_no_signal", 100, 0.03, 0)
    after = run.steps / 100 >= shapes.NO_SIGNAL_FROM
    assert np.all(run.signal("reward_std")[after] == 0) and np.all(run.table["frac_reward_zero_std"].to_numpy()[after] == 1)


def test_a_model_file_of_another_major_version_says_to_refit(tmp_path):
    path = tmp_path / "old.nc"
    bg.default_model().save(path)
    with h5netcdf.File(path, "a") as handle:
        fitted_on = json.loads(handle.attrs["fitted_on"])
        handle.attrs["fitted_on"] = json.dumps({**fitted_on, "model_version": "2.5"})
    with pytest.raises(bg.ModelError, match=rf"model 2\.5.*model {MODEL_VERSION}.*refit"):
        bg.load_model(path)


def test_a_reward_function_is_forecast_with_its_own_spread_never_the_summed_rewards():
    """Fit in the units you forecast in: a forecast of one reward function reads ``rewards/<fn>/std``; the summed reward's
    ``reward_std`` (another unit) never stands in for it, and an evaluation metric has no group spread at all."""
    steps = np.arange(1, 61)
    table = pd.DataFrame({
        "step": steps, "reward": np.linspace(0.2, 1.6, 60), "reward_std": np.full(60, 0.9),
        "rewards/acc/mean": np.linspace(0.1, 0.8, 60), "rewards/acc/std": np.full(60, 0.3),
        "rewards/fmt/mean": np.linspace(0.1, 0.8, 60), "eval_acc": np.linspace(0.1, 0.8, 60),
    })  # fmt: skip
    run = bg.read_log(table, total_steps=200)
    assert prepare_run(run).recent_reward_std == pytest.approx(0.9)
    assert prepare_run(run.with_metric("rewards/acc/mean")).recent_reward_std == pytest.approx(0.3)
    assert np.isnan(prepare_run(run.with_metric("rewards/fmt/mean")).recent_reward_std)  # no rewards/fmt/std logged
    assert np.isnan(prepare_run(run.with_metric("eval_acc")).recent_reward_std)
