"""Sweeps: ranking runs by their joint forecast (bg.rank, FittedModel.rank, ``bayes-grpo rank``) and the Optuna pruner."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest

import bayes_grpo as bg
from bayes_grpo.cli import main
from bayes_grpo.errors import BayesGrpoError, ModelError
from bayes_grpo.integrations.optuna import ForecastPruner
from bayes_grpo.measures import final_reward
from bayes_grpo.sweeps import FORECAST_ALONE, MAX_SCORE, Ranking, ScoreMap, SweepCoupling, model_coupling, rank, sweep_bounds

optuna.logging.set_verbosity(optuna.logging.WARNING)
TOTAL = 300  # every bundled run plans 300 steps


@pytest.fixture(scope="module")
def model() -> bg.FittedModel:
    return bg.default_model()


@pytest.fixture(scope="module")
def runs() -> bg.RunSet:
    return bg.load_runs()


@pytest.fixture(scope="module")
def best_and_worst(runs: bg.RunSet) -> tuple[bg.RunLog, bg.RunLog]:
    """The bundled runs with the highest and the lowest final reward (1.77 against 0.13 on a 0-1.8 range)."""
    ordered = sorted(runs, key=lambda r: final_reward(r.rewards))
    return ordered[-1], ordered[0]


@pytest.fixture(scope="module")
def ranking(model: bg.FittedModel, runs: bg.RunSet) -> Ranking:
    """Three runs of one task at different steps, one of them finished."""
    task = [r for r in runs if r.run_id.startswith("gpt_neox-l-add2-noise0.2-lr0.001")]
    return model.rank([task[0].head(90), task[1].head(150), task[2]], total_steps=TOTAL)


# ------------------------------------------------------------------ rank


def test_the_table_has_one_row_per_run_and_p_best_sums_to_one(ranking: Ranking) -> None:
    table = ranking.table
    assert list(table.columns) == ["run_id", "step", "total_steps", "finished", "mean", "q05", "q50", "q95", "p_best"]
    assert sorted(table["run_id"]) == sorted(ranking.run_ids) and len(table) == 3
    assert table["p_best"].sum() == pytest.approx(1.0)
    assert table["q50"].is_monotonic_decreasing  # best first by the point forecast
    assert (table["q05"] <= table["q50"]).all() and (table["q50"] <= table["q95"]).all()
    assert sorted(table["step"]) == [90, 150, TOTAL] and table["finished"].sum() == 1


def test_a_finished_run_ends_at_its_measured_final_reward(ranking: Ranking, runs: bg.RunSet) -> None:
    row = ranking.table.set_index("run_id").loc[ranking.run_ids[2]]
    measured = final_reward(runs[ranking.run_ids[2]].rewards)
    assert row["finished"] and row["q05"] == row["q95"] == pytest.approx(measured)


def test_p_beats_falls_as_the_value_rises(ranking: Ranking) -> None:
    values = np.linspace(ranking.finals.min() - 0.1, ranking.finals.max() + 0.1, 25)
    table = np.array([ranking.p_beats(v).to_numpy() for v in values])
    assert np.all(np.diff(table, axis=0) <= 0)
    assert np.all(table[0] == 1.0) and np.all(table[-1] == 0.0)


def test_a_clearly_better_run_gets_a_high_p_best(model: bg.FittedModel, best_and_worst: tuple[bg.RunLog, bg.RunLog]) -> None:
    best, worst = best_and_worst
    result = bg.rank(model, [worst.head(150), best.head(150)], total_steps=TOTAL, beat=1.0)
    p_best = result.p_best
    assert p_best[best.run_id] > 0.95 and p_best[worst.run_id] < 0.05
    assert result.table["p_beats"].tolist() == result.p_beats(1.0).loc[result.table["run_id"]].tolist()


def test_the_same_seed_gives_the_same_ranking_whatever_the_order(model: bg.FittedModel, runs: bg.RunSet) -> None:
    heads = [runs[i].head(120) for i in range(3)]
    forward = rank(model, heads, total_steps=TOTAL, seed=3).p_best
    again = model.rank(heads[::-1], total_steps=TOTAL, seed=3, n_jobs=1).p_best
    pd.testing.assert_series_equal(forward, again.loc[forward.index])


def test_joint_draws_follow_each_runs_forecast_quantiles(ranking: Ranking) -> None:
    """Read as the coupling's distribution of real scores, each run's joint finals sit at its forecast's quantiles."""
    for i, fc in enumerate(ranking.forecasts):
        if not ranking.finished[i]:
            scores = np.array([ScoreMap.from_draws(fc.final.samples).score(v) for v in ranking.finals[:100, i]])
            np.testing.assert_allclose(ScoreMap.from_draws(fc.final.samples).value(scores), ranking.finals[:100, i], atol=1e-9)
        assert ranking.trajectories(ranking.run_ids[i]).shape == (ranking.finals.shape[0], fc.steps.size)
    assert ranking.finished_scores.size == 1 and ranking.fraction == pytest.approx(0.4)


def test_with_no_finished_run_each_runs_final_in_the_ranking_is_its_forecast(model: bg.FittedModel, runs: bg.RunSet) -> None:
    """rank and forecast agree: each run's marginal in the joint draws is its calibrated forecast, the sweep
    coupling only ties the runs together; the raw path (calibrated=False) reads them through the real misses instead."""
    heads = [runs[i].head(90) for i in range(3)]
    ranking = rank(model, heads, total_steps=TOTAL, joint_draws=20_000, seed=1)
    assert all(fc.calibrated for fc in ranking.forecasts)
    for i, head in enumerate(heads):
        alone = model.forecast(head, total_steps=TOTAL, seed=4).final.samples
        width = np.subtract(*np.quantile(alone, [0.95, 0.05]))
        np.testing.assert_allclose(np.quantile(ranking.finals[:, i], [0.05, 0.5, 0.95]), np.quantile(alone, [0.05, 0.5, 0.95]), atol=0.1 * width)
    raw = rank(model, heads, total_steps=TOTAL, joint_draws=20_000, seed=1, calibrated=False)
    assert not any(fc.calibrated for fc in raw.forecasts)
    coupling = model.sweep_coupling.for_calibrated()
    assert coupling.correlation == model.sweep_coupling.correlation and coupling.at(0.3).value(1.0) == pytest.approx(1.0)


def test_a_sweep_of_0_or_1_rewards_is_ranked_within_the_range_its_logs_show(model: bg.FittedModel) -> None:
    """A 0/1 reward (reward_std**2 = r (1 - r) at every step): no final in the ranking above the inferred ceiling, however
    wide the forecasts (ranking raw draws once printed means of 1.06-1.09 and a q95 of 2.9 for such a sweep)."""
    rng = np.random.default_rng(0)

    def binary_run(name: str, level: float) -> bg.RunLog:
        steps = np.arange(1, 61)
        mean = np.clip(level * (1 - np.exp(-steps / 20)) + rng.normal(0, 0.03, steps.size), 0.02, 0.98)
        frame = pd.DataFrame({"step": steps, "reward": mean, "reward_std": np.sqrt(mean * (1 - mean))})
        return bg.read_log(frame, run_id=name, total_steps=200)

    sweep = [binary_run("a", 0.6), binary_run("b", 0.3), binary_run("c", 0.05)]
    ranking = rank(model, sweep, seed=0)
    assert all(fc.prepared.bounds is not None and fc.prepared.bounds[1] < 1.05 for fc in ranking.forecasts)
    assert ranking.finals.max() <= max(fc.prepared.bounds[1] for fc in ranking.forecasts) + 1e-9
    assert ranking.table["q95"].max() < 1.05 and ranking.table["mean"].max() < 1.0


def test_ranking_heads_raises_no_floating_point_warning(model: bg.FittedModel, runs: bg.RunSet) -> None:
    """The mode search's trial points far outside a posterior overflow its curve; that is a failed step, not news for the user."""
    heads = [runs[i].head(120) for i in range(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        rank(model, heads, total_steps=TOTAL, seed=0)


def test_forecast_alone_keeps_each_runs_forecast_and_draws_runs_independently(model: bg.FittedModel, runs: bg.RunSet) -> None:
    heads = [runs[i].head(120) for i in range(3)]
    alone = rank(model, heads, total_steps=TOTAL, coupling=FORECAST_ALONE, joint_draws=20_000)
    for i, fc in enumerate(alone.forecasts):
        np.testing.assert_allclose(np.quantile(alone.finals[:, i], [0.1, 0.5, 0.9]), np.quantile(fc.final.samples, [0.1, 0.5, 0.9]), atol=0.03 * np.ptp(fc.final.samples))
    assert abs(np.corrcoef(alone.finals.T)[0, 1]) < 0.05


def test_a_sweeps_runs_are_drawn_together_so_their_difference_is_narrower(model: bg.FittedModel, runs: bg.RunSet) -> None:
    """The shared effect makes two runs' finals correlate, so their difference spreads less than independent draws' would."""
    heads = [runs[i].head(90) for i in range(2)]
    coupled = rank(model, heads, total_steps=TOTAL, joint_draws=20_000).finals
    rho = bg.default_model().sweep_coupling.rho(90 / TOTAL)
    assert np.corrcoef(coupled.T)[0, 1] > 0.5 * rho
    shuffled = np.column_stack([coupled[:, 0], np.random.default_rng(0).permutation(coupled[:, 1])])
    assert np.std(coupled[:, 0] - coupled[:, 1]) < 0.9 * np.std(shuffled[:, 0] - shuffled[:, 1])


def test_finished_runs_above_their_forecasts_lift_the_runs_still_going(model: bg.FittedModel) -> None:
    """Two finished late risers ended far above their forecasts from 30%: the sweep's shared effect is positive and the
    third riser's forecast is lifted above its forecast alone."""
    riser = lambda seed: bg.read_log(pd.DataFrame({"step": np.arange(1, 101), "reward": _late_riser(seed)}), run_id=f"riser-{seed}", total_steps=100)
    sweep = [riser(0), riser(1), riser(2).head(30)]
    coupled = rank(model, sweep, seed=0)
    assert coupled.finished_scores.size == 2 and np.all(coupled.finished_scores > 1.0)
    assert coupled.shared_effect[0] > 0.5 and coupled.shared_effect[1] < 1.0
    alone = rank(model, sweep, seed=0, coupling=FORECAST_ALONE)
    assert np.median(coupled.finals[:, 2]) > np.median(alone.finals[:, 2]) + 0.05


def test_score_map_round_trips_and_continues_its_tails() -> None:
    draws = np.random.default_rng(0).normal(2.0, 0.5, 20_000)
    m = ScoreMap.from_draws(draws)
    for z in (-4.0, -1.0, 0.0, 0.7, 3.0):
        assert m.score(float(m.value(z))) == pytest.approx(z, abs=1e-6)
    assert float(m.value(0.0)) == pytest.approx(2.0, abs=0.02) and float(m.value(4.0)) == pytest.approx(4.0, abs=0.1)
    flat = ScoreMap.from_draws(np.full(100, 0.3))
    assert float(flat.value(5.0)) == 0.3 and flat.score(0.4) == MAX_SCORE and flat.score(0.2) == -MAX_SCORE


def test_sweep_coupling_is_checked_and_measured_from_scores() -> None:
    with pytest.raises(ModelError, match="one row of score quantiles"):
        SweepCoupling(fractions=(0.2, 0.3), score_quantiles=((0.0,) * 9,), correlation=(0.1, 0.1))
    with pytest.raises(ModelError, match="correlations in \\[0, 1\\)"):
        SweepCoupling(fractions=(0.2,), score_quantiles=((0.0,) * 9,), correlation=(1.0,))
    rng = np.random.default_rng(0)
    shared = np.repeat(rng.standard_normal(60), 3)  # 60 sources of 3 runs, half the variance shared
    frame = pd.DataFrame({"fraction": 0.3, "source": np.repeat(np.arange(60), 3), "score": np.sqrt(0.5) * shared + np.sqrt(0.5) * rng.standard_normal(180)})
    measured = SweepCoupling.measure(frame, repeats=3)
    assert measured.fractions == (0.3,) and measured.rho(0.3) == pytest.approx(0.5, abs=0.15)
    assert measured.at(0.3).value(0.0) == pytest.approx(0.0, abs=0.25)


@pytest.mark.parametrize(
    ("build", "total_steps", "message"),
    [
        (lambda runs: [runs[0]], None, "at least two, got 1"),
        (lambda runs: [runs[0].head(50), runs[0].head(60)], None, "distinct run ids"),
        (lambda runs: [runs[0], runs[1].with_meta(total_steps=400)], None, "plan different lengths"),
        (lambda runs: [runs[0], runs[1]], 200, "total_steps=200 is before the last logged step"),
        (lambda runs: [runs[0], runs[1]], 0, "total_steps must be a whole number >= 1"),
        (lambda runs: [runs[0], "not a run"], None, "needs RunLog objects"),
    ],
)
def test_bad_runs_get_a_clear_error(model: bg.FittedModel, runs: bg.RunSet, build, total_steps: int | None, message: str) -> None:
    with pytest.raises(ModelError, match=message):
        rank(model, build(runs), total_steps=total_steps)


def test_a_beat_that_is_not_a_number_is_refused(model: bg.FittedModel, runs: bg.RunSet, ranking: Ranking) -> None:
    with pytest.raises(ModelError, match="beat must be a finite number"):
        rank(model, [runs[0], runs[1]], beat="high")
    with pytest.raises(ModelError, match="finite number"):
        ranking.p_beats(float("nan"))


def test_the_plot_draws_a_fan_per_run_still_going(ranking: Ranking) -> None:
    import matplotlib

    matplotlib.use("Agg")
    ax = ranking.plot()
    assert len(ax.collections) == 2 and len(ax.get_legend().get_texts()) == 3


def test_joint_finals_stay_within_the_sweeps_bounds_but_never_inside_a_forecast(ranking: Ranking, runs: bg.RunSet) -> None:
    assert sweep_bounds([np.array([0.2, 0.4])], reward_range=(0.0, 1.8)) == (0.0, 1.8)
    low, high = sweep_bounds([np.linspace(0.0, 1.0, 11), np.linspace(0.5, 0.7, 11)])
    assert low < 0.0 and 1.0 < high < 3.0
    m = ScoreMap.from_draws(np.random.default_rng(0).normal(0.0, 1.0, 5000))
    bounded = m.bounded_value(np.array([-40.0, 0.0, 40.0]), -0.5, 0.5)
    assert bounded[0] == pytest.approx(m.values[0]) and bounded[2] == pytest.approx(m.values[-1]) and bounded[1] == pytest.approx(float(m.value(0.0)))
    assert ranking.finals.max() <= max(1.8, max(np.quantile(fc.final.samples, 0.99) for fc in ranking.forecasts)) + 1e-9


def test_plot_fans_draws_one_panel_per_run_best_first(ranking: Ranking) -> None:
    import matplotlib

    matplotlib.use("Agg")
    figure = ranking.plot_fans(columns=2)
    shown = [ax for ax in figure.axes if ax.get_visible()]
    assert len(shown) == 3 and len(figure.axes) == 4
    prefix = "gpt_neox-l-add2-noise0.2-lr0.001-"  # the runs' common prefix is left out of the titles
    assert [prefix + ax.get_title().split("\n")[0] for ax in shown] == list(ranking.table["run_id"])
    still_going = [ax for ax, finished in zip(shown, ranking.table["finished"]) if not finished]
    from matplotlib.collections import PolyCollection

    assert all(sum(isinstance(c, PolyCollection) for c in ax.collections) == 2 for ax in still_going)  # the 90% and 50% bands
    assert all(len(ax.containers) == 1 for ax in shown)  # the final's 90% interval from the joint draws


# ------------------------------------------------------------------ the command line


def _csv(folder: Path, name: str, total_steps: int, rewards: np.ndarray) -> Path:
    path = folder / f"{name}.csv"
    pd.DataFrame({"step": np.arange(1, rewards.size + 1), "reward": rewards, "total_steps": total_steps}).to_csv(path, index=False)
    return path


def test_cli_ranks_runs_named_by_a_glob_and_draws_their_fans(tmp_path: Path, runs: bg.RunSet, capsys: pytest.CaptureFixture[str]) -> None:
    for run in runs[:3]:
        _csv(tmp_path, run.run_id, TOTAL, run.rewards)
    plot = tmp_path / "fans.png"
    code = main(["rank", str(tmp_path / "*.csv"), "--at", "100", "--beat", "0.5", "--plot", str(plot)])
    out = capsys.readouterr().out
    assert code == 0 and "p_best" in out and "p_beats" in out and plot.stat().st_size > 0
    assert all(run.run_id in out for run in runs[:3])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: [str(d)], "no logs found"),
        (lambda d: [str(_csv(d, "a", 100, np.linspace(0, 1, 40)))], "holds 1; give at least two"),
        (lambda d: [str(_csv(d, "a", 100, np.linspace(0, 1, 40))), str(_csv(d, "b", 200, np.linspace(0, 1, 40)))], "plan different lengths .* pass --total-steps"),
        (lambda d: [str(d / "none*.csv")], "no file or folder matches"),
        (lambda d: [str(_csv(d, "a", 100, np.linspace(0, 1, 40))), str(_csv(d, "b", 100, np.array([0.1, 0.2])))], "too few to learn a reward scale"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], make, message: str) -> None:
    code = main(["rank", *make(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("bayes-grpo: error:") and "\n" not in err
    assert re.search(message, err), err


def test_cli_total_steps_compares_runs_of_different_plans(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _csv(tmp_path, "a", 100, 0.5 + 0.01 * np.arange(40))
    b = _csv(tmp_path, "b", 200, 0.2 + 0.002 * np.arange(40))
    assert main(["rank", str(a), str(b), "--total-steps", "120"]) == 0
    assert "at step 120" in capsys.readouterr().out


# ------------------------------------------------------------------ the Optuna pruner


def _replay(study: optuna.Study, run: bg.RunLog, sign: float = 1.0, attrs: dict | None = None) -> tuple[bool, int]:
    """One trial reporting ``run``'s rewards (times ``sign``) step by step; (pruned, last step reported)."""
    trial = study.ask()
    for key, value in (attrs or {}).items():
        trial.set_user_attr(key, value)
    for step, reward in zip(run.steps, run.rewards):
        trial.report(sign * float(reward), int(step))
        if trial.should_prune():
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            return True, int(step)
    study.tell(trial, sign * final_reward(run.rewards))
    return False, int(run.last_step)


def test_the_pruner_stops_a_trial_that_cannot_beat_a_finished_one(model: bg.FittedModel, best_and_worst: tuple[bg.RunLog, bg.RunLog]) -> None:
    best, worst = best_and_worst
    pruner = ForecastPruner(model, total_steps=TOTAL, check_interval=0.05)
    study = optuna.create_study(direction="maximize", pruner=pruner)
    assert _replay(study, best) == (False, TOTAL)
    pruned, step = _replay(study, worst)
    assert pruned and 0.3 * TOTAL + 0.05 * TOTAL <= step < 0.6 * TOTAL  # two checks in a row (every 5%) from min_fraction (0.3) on
    # the worse run first: the better one, forecast to end far above, trains to its end
    study = optuna.create_study(direction="maximize", pruner=ForecastPruner(model, total_steps=TOTAL, check_interval=0.05))
    assert _replay(study, worst) == (False, TOTAL) and _replay(study, best) == (False, TOTAL)


def test_patience_waits_for_that_many_checks_in_a_row(model: bg.FittedModel, best_and_worst: tuple[bg.RunLog, bg.RunLog]) -> None:
    best, worst = best_and_worst
    stops = {}
    for patience in (1, 3):
        study = optuna.create_study(direction="maximize", pruner=ForecastPruner(model, total_steps=TOTAL, check_interval=0.05, patience=patience))
        _replay(study, best)
        stops[patience] = _replay(study, worst)
    assert stops[1][0] and stops[3][0]
    assert stops[3][1] == stops[1][1] + 2 * int(0.05 * TOTAL)  # two more checks, every 15 steps
    with pytest.raises(BayesGrpoError, match="patience must be a whole number >= 1"):
        ForecastPruner(model, patience=0)


def test_a_minimised_objective_is_pruned_like_the_maximised_one(model: bg.FittedModel, best_and_worst: tuple[bg.RunLog, bg.RunLog]) -> None:
    best, worst = best_and_worst
    study = optuna.create_study(direction="minimize", pruner=ForecastPruner(model, total_steps=TOTAL, check_interval=0.05))
    _replay(study, best, sign=-1.0)
    pruned, step = _replay(study, worst, sign=-1.0)
    assert pruned and step < 0.6 * TOTAL
    probability, bar = study.pruner.beat_probability(study, study.trials[-1])  # type: ignore[misc]
    assert probability < 0.05 and bar == pytest.approx(-final_reward(best.rewards))


def test_a_trial_without_a_planned_length_gets_an_error_naming_both_ways(model: bg.FittedModel, runs: bg.RunSet) -> None:
    study = optuna.create_study(direction="maximize", pruner=ForecastPruner(model))
    trial = study.ask()
    for step in range(1, 10):
        trial.report(0.1 * step, step)
    with pytest.raises(BayesGrpoError, match=r"ForecastPruner\(total_steps=N\).*set_user_attr\('total_steps', N\)"):
        trial.should_prune()


def test_trials_of_another_process_set_the_bar(tmp_path: Path, model: bg.FittedModel, best_and_worst: tuple[bg.RunLog, bg.RunLog]) -> None:
    """Two Study objects on one SQLite storage, as two worker processes would have: the second sees the first's trial."""
    best, worst = best_and_worst
    storage = f"sqlite:///{tmp_path / 'sweep.db'}"
    first = optuna.create_study(study_name="sweep", storage=storage, direction="maximize")
    first.add_trial(
        optuna.trial.create_trial(value=final_reward(best.rewards), intermediate_values={int(s): float(r) for s, r in zip(best.steps, best.rewards)})
    )
    second = optuna.load_study(study_name="sweep", storage=storage, pruner=ForecastPruner(model, total_steps=TOTAL, check_interval=0.05))
    assert _replay(second, worst)[0]


def test_no_trial_is_forecast_twice_from_the_same_steps(model: bg.FittedModel, runs: bg.RunSet, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, int]] = []
    forecast = model.forecast

    def counted(run: bg.RunLog, *args: object, **kwargs: object) -> object:
        calls.append((run.run_id, int(run.last_step)))
        return forecast(run, *args, **kwargs)

    monkeypatch.setattr(model, "forecast", counted)
    study = optuna.create_study(direction="maximize", pruner=ForecastPruner(model, total_steps=TOTAL, min_fraction=0.3, check_interval=0.1))
    assert _replay(study, runs[0]) == (False, TOTAL)
    running, asking = study.ask(), study.ask()  # two trials side by side; only the second asks
    for step, mine, theirs in zip(runs[2].steps[:250], runs[2].rewards, runs[1].rewards):
        running.report(float(theirs), int(step))
        asking.report(float(mine), int(step))
        if asking.should_prune():
            break
    assert len(calls) == len(set(calls)), "a trial was forecast twice from the same steps"
    # the finished trial: at its own checks (30%, 40%, ..., 90% of the plan) only; its last one also couples it to the others
    assert [step for run_id, step in calls if run_id == f"trial {study.trials[0].number}"] == list(range(90, TOTAL, 30))
    # the asking trial is checked at 30, 40, ..., 80% of the plan (steps 90 to 240), until it is pruned or ends
    assert sum(run_id == f"trial {asking.number}" for run_id, _ in calls) == len(range(90, min(int(step), 240) + 1, 30))


def test_a_study_the_pruner_cannot_serve_is_refused(model: bg.FittedModel) -> None:
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.ask()  # Optuna refuses reports and should_prune for several objectives; the pruner is asked directly
    with pytest.raises(BayesGrpoError, match="single-objective"):
        ForecastPruner(model, total_steps=10).prune(study, study.trials[0])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"threshold": 0}, "threshold must be a number between 0 and 1"),
        ({"min_fraction": 1.0}, "min_fraction must be a number in"),
        ({"check_interval": 0}, "check_interval must be a number in"),
        ({"total_steps": 0}, "the pruner's arguments: total_steps must be a whole number >= 1"),
        ({"params_b": -1}, "params_b in the pruner's arguments must be a positive number"),
        ({"n_draws": 10}, "n_draws must be a whole number >= 100"),
        ({"model": "shipped"}, "model must be a FittedModel"),
    ],
)
def test_bad_pruner_arguments_are_rejected_at_construction(kwargs: dict, message: str) -> None:
    with pytest.raises(BayesGrpoError, match=message):
        ForecastPruner(**kwargs)


def test_an_invalid_user_attribute_is_named(model: bg.FittedModel) -> None:
    study = optuna.create_study(direction="maximize", pruner=ForecastPruner(model))
    trial = study.ask()
    trial.set_user_attr("total_steps", "many")
    trial.report(0.1, 1)
    with pytest.raises(BayesGrpoError, match="trial 0's user attributes: total_steps must be a whole number"):
        trial.should_prune()


def test_the_pruner_works_with_no_arguments_when_trials_describe_themselves(best_and_worst: tuple[bg.RunLog, bg.RunLog]) -> None:
    best, worst = best_and_worst
    study = optuna.create_study(direction="maximize", pruner=ForecastPruner())
    attrs = {"total_steps": TOTAL, "family": "gpt_neox", "params_b": 0.0004}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _replay(study, best, attrs=attrs) == (False, TOTAL)
        pruned, step = _replay(study, worst, attrs=attrs)
    assert pruned and step < 0.6 * TOTAL


def _late_riser(seed: int, total: int = 100) -> np.ndarray:
    """Flat for a third of the plan, then a steep rise: the take-off a forecast from 30% of the steps does not see."""
    t = np.arange(1, total + 1) / total
    return 0.05 + 1.0 / (1.0 + (0.55 / t) ** 12) + 0.03 * np.random.default_rng(seed).standard_normal(total)


@pytest.mark.parametrize("coupled", [True, False])
def test_finished_trials_that_beat_their_forecasts_make_the_pruner_wait(model: bg.FittedModel, coupled: bool) -> None:
    """Two finished late risers ended above their forecasts from 30%: as one sweep, a third one is not pruned there."""
    coupling = None if coupled else FORECAST_ALONE
    pruner = ForecastPruner(model, total_steps=100, min_fraction=0.3, check_interval=0.1, coupling=coupling, patience=1)
    study = optuna.create_study(direction="maximize", pruner=pruner)
    finished = [_late_riser(seed) for seed in (0, 1)]
    for rewards in finished:  # finished elsewhere (never checked by this pruner): their forecasts are made when needed
        study.add_trial(optuna.trial.create_trial(value=float(rewards[-10:].mean()), intermediate_values=dict(enumerate(rewards.tolist(), start=1))))
    trial = study.ask()
    for step, reward in enumerate(_late_riser(2)[:30], start=1):
        trial.report(float(reward), step)
    probability, bar = pruner.beat_probability(study, study.trials[-1])  # type: ignore[misc]
    assert bar == pytest.approx(max(rewards[-10:].mean() for rewards in finished))
    assert trial.should_prune() is (not coupled)
    assert (probability >= 0.05) is coupled


def test_optuna_is_an_optional_extra_with_a_clear_message_when_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib
    import sys
    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    assert "optuna" not in " ".join(project["dependencies"]) and project["optional-dependencies"]["optuna"] == ["optuna>=4"]
    for name in [m for m in sys.modules if m == "optuna" or m.startswith("optuna.")]:
        monkeypatch.setitem(sys.modules, name, None)  # as if Optuna were not installed
    monkeypatch.delitem(sys.modules, "bayes_grpo.integrations.optuna")
    with pytest.raises(ImportError, match=r"needs Optuna: pip install 'bayes_grpo\[optuna\]'"):
        importlib.import_module("bayes_grpo.integrations.optuna")


def test_the_shipped_sweep_coupling_is_the_measured_one() -> None:
    """The shipped model file stores benchmarks/results/sweep_coupling.csv's figures (benchmarks/sweep_coupling.py) with its fit."""
    table = pd.read_csv(Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "sweep_coupling.csv")
    stored = bg.default_model().sweep_coupling
    assert stored == SweepCoupling.from_table(table)
    assert stored.fractions == tuple(table["fraction"])
    np.testing.assert_allclose(stored.correlation, table["correlation"], atol=1e-12)


def test_the_coupling_lives_with_its_fit(tmp_path: Path) -> None:
    """Saved with the fit id it was measured for; a fit without one ranks on its forecasts alone; another fit's is refused."""
    shipped = bg.default_model()
    path = shipped.save(tmp_path / "model.nc")
    assert bg.load_model(path).sweep_coupling == shipped.sweep_coupling
    alone = bg.load_model(path)
    alone.sweep_coupling = None
    assert model_coupling(alone) is FORECAST_ALONE and model_coupling(shipped) is shipped.sweep_coupling
    text = shipped.sweep_coupling.to_json("another-fit")
    import h5netcdf

    with h5netcdf.File(path, "a") as handle:
        handle.attrs["sweep_coupling"] = text
    with pytest.raises(bg.ModelError, match="sweep coupling was measured for fit another-fit"):
        bg.load_model(path)
