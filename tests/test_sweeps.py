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
from bayes_grpo.population import PARAMS, natural
from bayes_grpo.sweeps import Ranking, rank, unconstrained

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
    assert table["p_best"].is_monotonic_decreasing
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
    again = model.rank(heads, total_steps=TOTAL, seed=3).p_best
    pd.testing.assert_series_equal(forward, again)


def test_joint_draws_come_from_each_runs_own_forecast_draws(ranking: Ranking) -> None:
    for i, fc in enumerate(ranking.forecasts):
        if not ranking.finished[i]:
            assert np.isin(ranking.finals[:, i], fc.final.samples).all()
        assert ranking.trajectories(ranking.run_ids[i]).shape == (ranking.finals.shape[0], fc.steps.size)
    assert 1.0 <= ranking.component_ess <= 64.0


def test_unconstrained_inverts_the_models_natural_parameters(model: bg.FittedModel, runs: bg.RunSet) -> None:
    fc = model.forecast(runs[0].head(100), n_draws=200)
    theta = unconstrained(fc.params, model.model_config.gain_at)
    again = natural(dict(zip(PARAMS, theta.T)), model.model_config)
    for name in ("r0", "gain", "tau", "sigma"):
        np.testing.assert_allclose(again[name], fc.params[name], rtol=1e-9)


@pytest.mark.parametrize(
    ("build", "total_steps", "message"),
    [
        (lambda runs: [runs[0]], None, "at least two, got 1"),
        (lambda runs: [runs[0].head(50), runs[0].head(60)], None, "distinct run ids"),
        (lambda runs: [runs[0], runs[1].with_meta(total_steps=400)], None, "plan different lengths"),
        (lambda runs: [runs[0], runs[1]], 200, "beyond total_steps=200: .* pass their planned length"),
        (lambda runs: [runs[0], runs[1]], 0, "total_steps must be a whole number of at least 1"),
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
    assert pruned and 0.5 * TOTAL <= step < 0.6 * TOTAL  # from min_fraction (0.5) on
    # the worse run first: the better one, forecast to end far above, trains to its end
    study = optuna.create_study(direction="maximize", pruner=ForecastPruner(model, total_steps=TOTAL, check_interval=0.05))
    assert _replay(study, worst) == (False, TOTAL) and _replay(study, best) == (False, TOTAL)


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
        ({"total_steps": 0}, "total_steps in the pruner's arguments must be a whole number >= 1"),
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
    with pytest.raises(BayesGrpoError, match="total_steps in trial 0's user attributes must be a whole number"):
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


@pytest.mark.parametrize("recalibrate", [True, False])
def test_finished_trials_that_beat_their_forecasts_make_the_pruner_wait(model: bg.FittedModel, recalibrate: bool) -> None:
    """Two finished late risers ended above their forecasts from 30%: recalibrated, a third one is not pruned there."""
    pruner = ForecastPruner(model, total_steps=100, min_fraction=0.3, check_interval=0.1, recalibrate=recalibrate)
    study = optuna.create_study(direction="maximize", pruner=pruner)
    finished = [_late_riser(seed) for seed in (0, 1)]
    for rewards in finished:  # finished elsewhere (never checked by this pruner): their forecasts are made when needed
        study.add_trial(optuna.trial.create_trial(value=float(rewards[-10:].mean()), intermediate_values=dict(enumerate(rewards.tolist(), start=1))))
    trial = study.ask()
    for step, reward in enumerate(_late_riser(2)[:30], start=1):
        trial.report(float(reward), step)
    probability, bar = pruner.beat_probability(study, study.trials[-1])  # type: ignore[misc]
    assert bar == pytest.approx(max(rewards[-10:].mean() for rewards in finished))
    assert trial.should_prune() is (not recalibrate)
    assert (probability >= 0.05) is recalibrate


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
