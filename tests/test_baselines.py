"""The calibrated baselines the calibration layer is judged beside (evaluation.baselines)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bayes_grpo.errors import BayesGrpoError
from bayes_grpo.recalibration import LEVELS, raw_column
from evaluation import baselines


def _pinball(x: np.ndarray, y: np.ndarray, b: np.ndarray, level: float) -> float:
    residual = y - x @ b
    return float(np.mean(np.maximum(level * residual, (level - 1) * residual)))


def test_quantile_regression_recovers_a_line_and_its_quantiles():
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, 400)
    features = np.column_stack([np.ones_like(x), x])
    y = 1.0 + 2.0 * x + rng.standard_normal(400) * 0.1
    median = baselines.quantile_regression(features, y, 0.5)
    assert median == pytest.approx([1.0, 2.0], abs=0.05)
    upper = baselines.quantile_regression(features, y, 0.9)
    assert upper[0] - median[0] == pytest.approx(0.128, abs=0.04)  # the noise's 90% quantile, 1.28 SDs
    assert np.mean(y > features @ upper) == pytest.approx(0.1, abs=0.02)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([0.05, 0.25, 0.5, 0.95]))
def test_quantile_regression_is_the_pinball_minimum(seed, level):
    """No other line has a smaller pinball loss: not least squares, not the solution nudged in any direction."""
    rng = np.random.default_rng(seed)
    features = np.column_stack([np.ones(30), rng.standard_normal(30)])
    y = rng.standard_t(3, 30)
    best = baselines.quantile_regression(features, y, level)
    loss = _pinball(features, y, best, level)
    least_squares = np.linalg.lstsq(features, y, rcond=None)[0]
    assert loss <= _pinball(features, y, least_squares, level) + 1e-9
    for step in np.vstack([np.eye(2), -np.eye(2)]) * 0.05:
        assert loss <= _pinball(features, y, best + step, level) + 1e-9


def _rows(n_per_fold: int = 60, folds: int = 3, shift_fold: int | None = None, seed: int = 0) -> pd.DataFrame:
    """Held-out rows of a raw forecast that is right on average and whose misses are 1 reward_std wide."""
    rng = np.random.default_rng(seed)
    n = n_per_fold * folds
    anchor = rng.uniform(0, 1, n)
    scale = rng.uniform(0.05, 0.2, n)
    truth = anchor + scale * rng.standard_normal(n)
    fold = np.repeat(np.arange(folds), n_per_fold)
    if shift_fold is not None:
        truth = np.where(fold == shift_fold, truth + 100 * scale, truth)
    rows = pd.DataFrame({
        "run_id": [f"run-{i}" for i in range(n)], "source": [f"src-{i}" for i in range(n)], "set": "real",
        "fraction": rng.choice([0.2, 0.3, 0.5], n), "fold": fold, "truth": truth, "spread": 1.0, "anchor": anchor,
        "signal_scale": scale, "std_rel": np.where(rng.random(n) < 0.1, np.nan, rng.lognormal(0, 1, n)),
        "error": 0.0, "persistence_error": 0.0, "paper_law_error": 0.0, "change_after_cut": 0.0, "ess": 1000.0,
    })  # fmt: skip
    for p in LEVELS:
        rows[raw_column(p)] = anchor
    return rows


@pytest.mark.parametrize("name", list(baselines.BASELINES))
def test_the_baselines_calibrate_a_raw_forecast_that_is_too_narrow(name):
    """The raw forecast is a point; each baseline learns the misses' spread from the other folds and covers about 90%."""
    scored = baselines.cross_fitted(_rows(), baselines.BASELINES[name])
    assert len(scored) == 180
    assert scored["covered_90"].mean() == pytest.approx(0.9, abs=0.06)
    assert scored["covered_50"].mean() == pytest.approx(0.5, abs=0.1)
    assert (scored["q05"] <= scored["q50"]).all() and (scored["q50"] <= scored["q95"]).all()


@pytest.mark.parametrize("name", list(baselines.BASELINES))
def test_each_fold_is_scored_by_what_the_other_folds_taught(name):
    """Fold 0's truths sit 100 reward_stds up: learned on folds 1 and 2 only, its intervals miss them all."""
    scored = baselines.cross_fitted(_rows(shift_fold=0), baselines.BASELINES[name])
    assert scored.loc[scored["fold"] == 0, "above_q95"].all()
    assert not scored.loc[scored["fold"] == 0, "covered_90"].any()


def test_comparison_sets_the_layer_beside_the_raw_model_and_the_baselines():
    rows = _rows()
    rows = baselines.rescored(rows, rows[[raw_column(p) for p in LEVELS]].to_numpy())  # scored as the raw point forecast
    table = baselines.comparison(rows, calibrated=rows)
    assert set(table["method"]) == {baselines.RAW, baselines.LAYER, *baselines.BASELINES}
    raw = table[table["method"] == baselines.RAW]
    assert (raw["coverage_90"] == 0).all() and (raw["quantile_score_ratio"] == 1).all()


def test_the_baselines_need_raw_rows_of_several_folds():
    with pytest.raises(BayesGrpoError, match="at least two folds"):
        baselines.cross_fitted(_rows(folds=1), baselines.conformal_baseline)
    with pytest.raises(BayesGrpoError, match="signal_scale"):
        baselines.cross_fitted(_rows().drop(columns="signal_scale"), baselines.conformal_baseline)
