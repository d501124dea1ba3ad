"""Forecast calibration: sources, grouped folds, and scoring a real forecast against its real end."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bayes_grpo as bg
from bayes_grpo import measures
from bayes_grpo.errors import BayesGrpoError
from bayes_grpo.prepare import prepare_run
from bayes_grpo.settings import FORECAST_QUANTILES, GENERATOR_SOURCE
from evaluation import calibration, scoring
from evaluation.settings import shared_runs_dir


@settings(max_examples=200, deadline=None)
@given(
    groups=st.lists(st.integers(min_value=1, max_value=9), min_size=2, max_size=12),
    n_folds=st.integers(min_value=2, max_value=12),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_grouped_folds_never_split_a_source_and_stay_balanced(groups: list[int], n_folds: int, seed: int) -> None:
    sources = {f"s{g}-r{k}": f"s{g}" for g, size in enumerate(groups) for k in range(size)}
    if n_folds > len(groups):
        with pytest.raises(BayesGrpoError, match="n_folds"):
            calibration.grouped_folds(sources, n_folds, seed)
        return
    fold_of = calibration.grouped_folds(sources, n_folds, seed)
    assert fold_of == calibration.grouped_folds(dict(reversed(list(sources.items()))), n_folds, seed)
    assert set(fold_of) == set(sources) and set(fold_of.values()) == set(range(n_folds))
    fold_of_source = {}
    for run_id, fold in fold_of.items():
        assert fold_of_source.setdefault(sources[run_id], fold) == fold  # one source, one fold
    sizes = np.bincount(list(fold_of.values()), minlength=n_folds)
    assert sizes.max() - sizes.min() <= max(groups)


@settings(max_examples=100, deadline=None)
@given(
    bundled=st.lists(st.integers(min_value=10, max_value=60), min_size=1, max_size=4),
    real=st.lists(st.integers(min_value=1, max_value=4), min_size=5, max_size=30),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_grouped_folds_give_every_fold_its_share_of_real_runs(bundled: list[int], real: list[int], seed: int) -> None:
    # A few large bundled sources used to fill the first folds and push every real run into the last ones.
    sources = {f"b{g}-r{k}": f"{GENERATOR_SOURCE}/task{g}" for g, size in enumerate(bundled) for k in range(size)}
    sources |= {f"s{g}-r{k}": f"owner{g}/repo" for g, size in enumerate(real) for k in range(size)}
    fold_of = calibration.grouped_folds(sources, 5, seed)
    real_per_fold = np.bincount([fold for run_id, fold in fold_of.items() if run_id.startswith("s")], minlength=5)
    assert real_per_fold.max() - real_per_fold.min() <= max(real)
    bundled_per_fold = np.bincount([fold for run_id, fold in fold_of.items() if run_id.startswith("b")], minlength=5)
    assert bundled_per_fold.max() - bundled_per_fold.min() <= max(bundled)


def test_grouped_splits_partition_the_runs_by_fold(few_runs) -> None:
    runs = list(few_runs)
    sources = {r.run_id: f"s{i % 3}" for i, r in enumerate(runs)}
    fold_of = calibration.grouped_folds(sources, 3, seed=4)
    splits = calibration.grouped_splits(runs, sources, 3, seed=4)
    assert len(splits) == 3
    for fold, (train, test) in enumerate(splits):
        assert [r.run_id for r in test] == [r.run_id for r in runs if fold_of[r.run_id] == fold]
        assert [r.run_id for r in train] == [r.run_id for r in runs if fold_of[r.run_id] != fold]
        assert not {sources[r.run_id] for r in train} & {sources[r.run_id] for r in test}
    with pytest.raises(BayesGrpoError, match="n_folds"):
        calibration.grouped_splits(runs, sources, 4)


@pytest.fixture(scope="module")
def shared_runs():
    if shared_runs_dir() is None:
        pytest.skip("needs the shared external runs (../shared/external_runs)")
    return calibration.load_evaluation_runs(bundled=False)


def test_sources_come_from_the_loaded_metadata_and_match_the_index(shared_runs) -> None:
    runs, sources = shared_runs
    index = calibration.shared_index().set_index("run_id")["source_repo"]
    assert len(runs) == len(index)
    assert all(sources[r.run_id] == index[r.run_id] for r in runs)
    stripped = runs[0].with_meta(extra={})  # no metadata: joined on the index, else bundled
    assert calibration.source_of(stripped, index.to_dict()) == index[runs[0].run_id]
    assert calibration.source_of(stripped) == calibration.BUNDLED_SOURCE


def test_bundled_runs_are_grouped_by_generator_task_and_labelled_bundled() -> None:
    try:
        runs = bg.load_runs()
    except bg.LogError:
        pytest.skip("no bundled runs in data/runs")
    sources = {calibration.source_of(run) for run in runs}
    assert len(sources) > 1 and all(calibration.is_bundled(s) for s in sources)
    assert calibration.is_bundled(calibration.BUNDLED_SOURCE)
    if shared_runs_dir() is not None:
        assert not any(calibration.is_bundled(s) for s in calibration.shared_index()["source_repo"].astype(str))


def test_a_small_subset_spans_many_sources() -> None:
    if shared_runs_dir() is None:
        pytest.skip("needs the shared external runs (../shared/external_runs)")
    runs, sources = calibration.load_evaluation_runs(max_runs=8, seed=2)
    assert len(runs) == 8 and len(set(sources.values())) == 8
    assert [r.run_id for r in runs] == [r.run_id for r in calibration.load_evaluation_runs(max_runs=8, seed=2)[0]]


def test_score_cut_scores_any_forecaster_against_the_real_end(few_runs) -> None:
    """The shared scoring (also the LC-PFN benchmark's): what ``predict`` sees and how its forecast is scored."""
    run = max(few_runs, key=len)
    truth, spread = measures.final_reward(run.rewards), measures.reward_spread(run.rewards)
    seen = []

    def around(centre: float):
        def predict(head, total, window):
            seen.append((head.last_step, total, window))
            offsets = dict(zip(FORECAST_QUANTILES, (-0.2, -0.1, 0.0, 0.1, 0.2)))
            return centre, {q: centre + d * spread for q, d in offsets.items()}, np.nan

        return predict

    exact = calibration.score_cut(run, 0.3, around(truth))
    head_step, total, window = seen[-1]
    assert head_step == measures.cut(run, 0.3).last_step == exact["observed_step"] and total == measures.horizon(run)
    assert list(window) == list(run.steps[-measures.final_window_size(len(run)) :])
    assert exact["error"] == 0.0 and exact["covered_90"] and exact["covered_50"]
    assert exact["width_90"] == pytest.approx(0.4) and np.isnan(exact["ess"])
    high = calibration.score_cut(run, 0.3, around(truth + spread))
    assert high["error"] == pytest.approx(1.0) and high["below_q05"] and not high["covered_90"]
    assert high["quantile_score"] > exact["quantile_score"]
    partial = run.with_meta(total_steps=3 * run.last_step)
    assert calibration.score_cut(partial, 0.5, around(truth)) is None and len(seen) == 2  # nothing to forecast


@pytest.mark.slow
def test_scores_of_a_real_forecast_follow_the_definitions(quick_model, few_runs) -> None:
    run = max(few_runs, key=len)
    row = calibration.evaluate_run(quick_model, run, 0.3, seed=1)
    head = measures.cut(run, 0.3)
    truth, spread = measures.final_reward(run.rewards), measures.reward_spread(run.rewards)
    assert row["truth"] == pytest.approx(truth) and row["spread"] == pytest.approx(spread)
    assert row["observed_step"] == head.last_step
    quantiles = [row[k] for k in ("q05", "q25", "q50", "q75", "q95")]
    assert quantiles == sorted(quantiles)
    assert row["error"] == pytest.approx(abs(row["q50"] - truth) / spread)  # the median is the point forecast
    assert row["mean_error"] == pytest.approx(abs(row["forecast_mean"] - truth) / spread)
    assert row["persistence_error"] == pytest.approx(abs(scoring.persistence(head.rewards) - truth) / spread)
    assert row["covered_90"] == (row["q05"] <= truth <= row["q95"])
    assert row["covered_90"] + row["above_q95"] + row["below_q05"] == 1
    assert row["width_90"] == pytest.approx((row["q95"] - row["q05"]) / spread)
    expected = scoring.quantile_score(truth, dict(zip((0.05, 0.25, 0.5, 0.75, 0.95), quantiles)), spread)
    assert row["quantile_score"] == pytest.approx(expected)
    assert row == calibration.evaluate_run(quick_model, run, 0.3, seed=1)  # seeded
    # Both quantities come from the same forecast: its window reward on the real window, and its final window.
    fc = quick_model.forecast(head, total_steps=measures.horizon(run), seed=1)
    window = run.steps[-measures.final_window_size(len(run)) :]
    assert row["forecast_mean"] == pytest.approx(fc.window_reward(window).mean)
    final = calibration.evaluate_run(quick_model, run, 0.3, seed=1, quantity="final")
    assert final["truth"] == row["truth"] and final["forecast_mean"] == pytest.approx(fc.final.mean)
    assert row["ess"] == fc.ess and row["pareto_k"] == fc.pareto_k and row["proposal"] == fc.proposal
    assert sum(row[f"p_{name}"] for name in ("take_off_ahead", "plateau", "decline")) == pytest.approx(1.0)
    with pytest.raises(BayesGrpoError, match="quantity"):
        calibration.evaluate_run(quick_model, run, 0.3, quantity="median")  # type: ignore[arg-type]
    # A run logged for only part of its plan: from 50% of the plan, the head already holds the final window.
    partial = run.with_meta(total_steps=3 * run.last_step)
    assert calibration.evaluate_run(quick_model, partial, 0.5) is None


@pytest.mark.slow
def test_summaries_by_fraction_set_and_hardest_third(quick_model, few_runs) -> None:
    scores = calibration.evaluate(quick_model, few_runs[:3], (0.2, 0.5), seed=0)
    scores["set"] = ["real" if i % 2 else "bundled" for i in range(len(scores))]
    table = calibration.summarise(scores)
    assert list(table["fraction"]) == [0.2, 0.5] and table["runs"].sum() == len(scores)
    assert table["coverage_90"].between(0, 1).all() and (table["coverage_50"] <= table["coverage_90"]).all()
    assert np.allclose(table["ratio_to_persistence"], table["error"] / table["persistence"])
    assert table["pareto_k_above_0.7"].between(0, 1).all() and (table["ess_median"] > 0).all()
    health = calibration.health_table(scores)
    assert list(health["forecasts"]) == list(table["runs"]) and (health["ess_p10"] <= health["ess_median"]).all()
    assert np.allclose(health[["from_prior", "from_laplace", "from_particles", "from_mcmc"]].sum(axis=1), 1.0)
    assert np.allclose(health[["p_take_off_ahead", "p_plateau", "p_decline"]].sum(axis=1), 1.0)
    hard = calibration.hardest(scores)
    assert 0 < len(hard) < len(scores)
    for fraction, part in scores.groupby("fraction"):
        picked = hard[hard["fraction"] == fraction]["change_after_cut"]
        assert len(picked) and picked.min() >= np.quantile(part["change_after_cut"], 2 / 3) - 1e-12
    tables = calibration.summary_tables(scores)
    assert {"real runs", "bundled runs", "all runs"} <= set(tables)
    assert all(isinstance(t, pd.DataFrame) and len(t) for t in tables.values())
    fig = calibration.calibration_figure(scores)
    assert len(fig.axes) == 3


def _run(rewards: np.ndarray, run_id: str = "synthetic") -> bg.RunLog:
    steps = np.arange(1, len(rewards) + 1)
    return bg.read_log(pd.DataFrame({"step": steps, "reward": rewards}), run_id=run_id, family="qwen", params_b=0.5)


RISE_THEN_FLAT = np.r_[np.linspace(0.0, 1.0, 50), np.ones(50)]


def test_fold_cache_key_follows_runs_settings_and_seed_not_run_order() -> None:
    a, b = _run(RISE_THEN_FLAT), _run(RISE_THEN_FLAT[::-1], run_id="other")
    key = calibration.fold_cache_key([a, b], {}, 0)
    assert key == calibration.fold_cache_key([b, a], {}, 0) and len(key) == 64
    assert key != calibration.fold_cache_key([a], {}, 0)
    assert key != calibration.fold_cache_key([a, b], {"draws": 50}, 0)
    assert key != calibration.fold_cache_key([a, b], {}, 1)
    assert key != calibration.fold_cache_key([a, _run(RISE_THEN_FLAT[::-1] + 0.01, run_id="other")], {}, 0)


def test_fold_cache_key_follows_every_file_of_the_package_source(tmp_path, monkeypatch) -> None:
    package = Path(bg.__file__).resolve().parent
    copy = tmp_path / "bayes_grpo"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__", "assets"))
    train = [_run(RISE_THEN_FLAT)]
    key = calibration.fold_cache_key(train, {}, 0, package_dir=copy)
    assert key == calibration.fold_cache_key(train, {}, 0, package_dir=copy) and len(key) == 64  # same inputs, same key
    assert key == calibration.fold_cache_key(train, {}, 0)  # the default is the installed package: same source, same key
    (copy / "notes.txt").write_text("not code", encoding="utf-8")  # only the *.py files count
    assert calibration.fold_cache_key(train, {}, 0, package_dir=copy) == key
    # A new helper in any module, even one a fit never calls, names a new entry: no hand-kept list of fit code.
    watching = copy / "watching.py"
    watching.write_text(watching.read_text(encoding="utf-8") + "\n\ndef _new_helper():\n    return 1\n", encoding="utf-8")
    edited = calibration.fold_cache_key(train, {}, 0, package_dir=copy)
    assert edited != key
    (copy / "logs" / "new_format.py").write_text("X = 1\n", encoding="utf-8")  # a new module in a subpackage too
    with_module = calibration.fold_cache_key(train, {}, 0, package_dir=copy)
    assert with_module != edited
    monkeypatch.setattr(bg, "__version__", "0.0.0+test")  # and the package version
    assert calibration.fold_cache_key(train, {}, 0, package_dir=copy) != with_module


def test_a_cached_fold_fit_is_read_back_instead_of_refitted(tmp_path, request) -> None:
    train = [_run(RISE_THEN_FLAT)]
    try:
        shipped = bg.default_model()
    except bg.ModelError:  # the shipped file is being refitted: a short real fit stands in
        shipped = request.getfixturevalue("quick_model")
    shipped.save(tmp_path / f"fold-{calibration.fold_cache_key(train, {}, 3)}.nc", full=False)
    model, from_cache = calibration.cached_fit_fold(train, {}, 3, tmp_path)  # a fit of one 100-step run would not match the shipped posterior
    assert from_cache
    run = _run(RISE_THEN_FLAT).head(40).with_meta(total_steps=100)
    assert np.allclose(model.forecast(run, n_draws=50).draws, shipped.forecast(run, n_draws=50).draws)


def test_scoring_one_set_keeps_every_folds_training_runs() -> None:
    """Scoring only the real (or bundled) runs filters the held-out runs, never the training runs, so fits and cache keys stay."""
    if shared_runs_dir() is None:
        pytest.skip("needs the shared external runs (../shared/external_runs)")
    runs, sources = calibration.load_evaluation_runs()
    every = {job.fold: job for job in calibration.fold_jobs(runs, sources, 5)}
    counted = 0
    for scored, bundled in (("real", False), ("bundled", True)):
        for job in calibration.fold_jobs(runs, sources, 5, scored=scored):
            whole = every[job.fold]
            assert job.train == whole.train
            assert job.test and all(calibration.is_bundled(sources[r.run_id]) == bundled for r in job.test)
            assert job.test == tuple(r for r in whole.test if calibration.is_bundled(sources[r.run_id]) == bundled)
            counted += len(job.test)
    assert counted == len(runs)
    with pytest.raises(BayesGrpoError, match="'all', 'real' or 'bundled'"):
        calibration.scored_runs(runs, sources, "shared")  # type: ignore[arg-type]
    with pytest.raises(BayesGrpoError, match="no real runs to score"):
        calibration.cross_validate([r for r in runs if calibration.is_bundled(sources[r.run_id])], sources, n_folds=2, scored="real", progress=False)


def test_reward_bounds_say_where_the_reachable_range_came_from():
    """Declared by the log's reward_range, inferred from a 0/1 reward's reward_std, or none; and the benchmark's table by it."""
    rng = np.random.default_rng(0)
    steps = np.arange(1, 81)
    accuracy = np.clip(0.2 + 0.5 * steps / 80 + 0.03 * rng.standard_normal(80), 0.02, 0.98)
    binary = pd.DataFrame({"step": steps, "reward": accuracy, "reward_std": np.sqrt(accuracy * (1 - accuracy))})
    kinds = {
        "declared": bg.read_log(binary[["step", "reward"]], run_id="declared", total_steps=200, reward_range=(0.0, 1.0)),
        "inferred": bg.read_log(binary, run_id="inferred", total_steps=200),
        "none": bg.read_log(binary.assign(reward_std=0.3 + 0.1 * rng.random(80)), run_id="none", total_steps=200),
    }
    for expected, run in kinds.items():
        assert calibration.reward_bounds(prepare_run(run)) == expected
    # The 0/1 run gets its range declared for the benchmark's check; the others have nothing to declare.
    assert calibration.declared_range(kinds["inferred"]).reward_range == (0.0, 1.0)
    assert calibration.reward_bounds(prepare_run(calibration.declared_range(kinds["inferred"]))) == "declared"
    assert calibration.declared_range(kinds["declared"]) is None and calibration.declared_range(kinds["none"]) is None
    rows = pd.DataFrame({
        "reward_bounds": ["none", "inferred", "none"], "fraction": 0.3, "source": ["a", "b", "c"], "error": 0.1, "persistence_error": 0.2,
        "paper_law_error": 0.3, "covered_90": [True, False, True], "covered_50": True, "above_q95": [False, True, False],
        "below_q05": False, "width_90": 1.0, "quantile_score": 0.1, "change_after_cut": 0.2, "ess": 900.0,
    })  # fmt: skip
    table = calibration.by_reward_bounds(rows)
    assert table.set_index("reward_bounds").loc["inferred", "above_q95"] == 1.0
    assert table.set_index("reward_bounds").loc["none", "coverage_90"] == 1.0
    assert calibration.by_reward_bounds(rows.drop(columns="reward_bounds")).empty


def test_upper_reach_measures_the_tail_and_the_truths_above_the_best_logged_reward() -> None:
    # Three runs of three sources at one cut, spread 1: truths 0.2 below, at and 0.5 above the best logged reward,
    # and a q95 of 2, 1 and 3 above it; the raw model's q95 sits 0.5 above it in every run.
    scores = pd.DataFrame({
        "fraction": 0.3, "run_id": ["a", "b", "c"], "source": ["s1", "s2", "s3"], "spread": 1.0,
        "best_logged": [0.4, 0.5, 0.6], "truth": [0.2, 0.5, 1.1], "q95": [2.4, 1.5, 3.6],
    })  # fmt: skip
    raw = scores.assign(q95=scores["best_logged"] + 0.5)
    table = calibration.upper_reach(scores, raw).iloc[0]
    assert table["runs"] == 3
    assert table["truth_above_best_q50"] == pytest.approx(0.0)
    assert table["truth_above_best_max"] == pytest.approx(0.5)
    assert table["q95_above_best_q50"] == pytest.approx(2.0)
    assert table["raw_q95_above_best_q50"] == pytest.approx(0.5)
    # Every scored row carries the best reward logged by the cut.
    run = bg.read_log(pd.DataFrame({"step": np.arange(1, 41), "reward": np.r_[np.linspace(0, 1, 20), np.full(20, 0.5)]}), run_id="r", total_steps=40)
    row = calibration.score_cut(run, 0.5, lambda head, total, window: (0.5, dict.fromkeys(FORECAST_QUANTILES, 0.5), np.nan))
    assert row["best_logged"] == pytest.approx(1.0)


def test_by_plan_length_splits_short_middle_and_long_plans_and_signs_the_miss() -> None:
    # One run per source and plan length at one cut, spread 1: the short plan's truth lies 0.6 above its median
    # and outside its interval, the others' on it.
    scores = pd.DataFrame({
        "fraction": 0.2, "run_id": ["a", "b", "c"], "source": ["s1", "s2", "s3"], "total_steps": [50, 250, 2000],
        "spread": 1.0, "truth": [1.1, 0.5, 0.4], "q50": [0.5, 0.5, 0.4], "covered_90": [False, True, True],
        "above_q95": [True, False, False], "error": [0.6, 0.1, 0.2], "persistence_error": [0.5, 0.2, 0.4],
    })  # fmt: skip
    scores = scores.assign(**dict.fromkeys(
        ("paper_law_error", "covered_50", "below_q05", "width_90", "quantile_score", "change_after_cut", "ess"), 0.0
    ))  # the other columns of a scored row, which summarise reads
    table = calibration.by_plan_length(scores).set_index("plan (steps)")
    assert list(table.index) == ["up to 60", "61-300", "over 300"]
    assert table.loc["up to 60", "median_miss"] == pytest.approx(0.6)
    assert table.loc["up to 60", "coverage_90"] == 0.0 and table.loc["up to 60", "above_q95"] == 1.0
    assert table.loc["up to 60", "ratio_to_persistence"] == pytest.approx(1.2)
    assert table.loc["over 300", "ratio_to_persistence"] == pytest.approx(0.5)
    assert table["runs"].tolist() == [1, 1, 1]
