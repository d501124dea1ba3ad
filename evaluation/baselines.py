"""Calibrated baselines the calibration layer must beat, learned on the same held-out raw forecasts.

The model-4 issue names two cheap ways to calibrate the raw model, each learned by
source-grouped cross-validation on the real runs (both are in units of the run's recent
``reward_std``, :func:`bayes_grpo.recalibration.signal_scale`: the logged spread for a log
without it):

* **linear quantile regression** of the change after the cut (truth minus the persistence
  level) on the cut, the raw model's median change and log ``std_rel``
  (:func:`linear_quantile_baseline`);
* **split-conformal**: the raw model's median plus quantiles of its held-out misses, per third
  of ``std_rel`` (runs without ``reward_std`` apart; :func:`conformal_baseline`).

Both learn their 5% and 95% quantiles :data:`~bayes_grpo.recalibration.TAIL_MARGIN` further
out, as the layer does, and both are cross-fitted: each fold's rows get quantiles learned on
the other folds' rows, each source counted as at most
:data:`~evaluation.calibration.SOURCE_CAP` runs (:func:`cross_fitted`). The rows they learn
from and are scored on are :func:`evaluation.calibration.evaluate`'s raw rows (``raw_q05`` ...,
``anchor``, ``signal_scale``, ``std_rel``), so the layer and the baselines are judged on the
same forecasts.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
from scipy.optimize import linprog

from bayes_grpo.errors import BayesGrpoError
from bayes_grpo.measures import weighted_quantile
from bayes_grpo.recalibration import LEVELS, learned_level, raw_column
from evaluation import scoring
from evaluation.calibration import SOURCE_CAP, by_signal_third, source_weights, summarise

#: A baseline maps (training rows, rows to forecast) to a (rows, LEVELS) array of quantiles of the final-window reward.
Baseline = Callable[[pd.DataFrame, pd.DataFrame], np.ndarray]
#: Fewest training rows a conformal group uses before it falls back to all the training rows.
MIN_GROUP_ROWS = 5


def quantile_regression(features: np.ndarray, target: np.ndarray, level: float, weights: np.ndarray | None = None) -> np.ndarray:
    """Coefficients of the weighted linear quantile regression of ``target`` on ``features`` at ``level``.

    The pinball loss is minimised exactly as a linear programme (HiGHS, :func:`scipy.optimize.linprog`):
    ``min sum w (level u + (1 - level) v)`` subject to ``features @ b + u - v = target``, ``u, v >= 0``.
    """
    n, k = features.shape
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=float)
    cost = np.concatenate([np.zeros(k), level * w, (1.0 - level) * w])
    result = linprog(cost, A_eq=np.hstack([features, np.eye(n), -np.eye(n)]), b_eq=target, bounds=[(None, None)] * k + [(0, None)] * (2 * n), method="highs")
    if not result.success:
        raise BayesGrpoError(f"quantile regression at {level:g} did not solve: {result.message}")
    return result.x[:k]


def _log_std_rel(rows: pd.DataFrame) -> pd.Series:
    return np.log(rows["std_rel"].where(rows["std_rel"] > 0))


def _regression_features(rows: pd.DataFrame, fill: float) -> np.ndarray:
    """Intercept, the cut, the raw median change in ``reward_std`` units, log ``std_rel`` (``fill`` where unknown)."""
    change = (rows[raw_column(0.5)] - rows["anchor"]) / rows["signal_scale"]
    return np.column_stack([np.ones(len(rows)), rows["fraction"], change, _log_std_rel(rows).fillna(fill)])


def linear_quantile_baseline(train: pd.DataFrame, test: pd.DataFrame) -> np.ndarray:
    """Quantiles of ``test`` from linear quantile regressions learned on ``train`` (module docstring), sorted per row."""
    fill = float(np.nanmedian(_log_std_rel(train)))
    target = ((train["truth"] - train["anchor"]) / train["signal_scale"]).to_numpy(float)
    weights = source_weights(train, by=["fraction"]).to_numpy(float)
    features, test_features = _regression_features(train, fill), _regression_features(test, fill)
    changes = np.column_stack([test_features @ quantile_regression(features, target, learned_level(p), weights) for p in LEVELS])
    return np.sort(test["anchor"].to_numpy(float)[:, None] + test["signal_scale"].to_numpy(float)[:, None] * changes, axis=1)


def _signal_groups(rows: pd.DataFrame, edges: list[float]) -> np.ndarray:
    """0, 1, 2: the thirds of log ``std_rel`` split at ``edges``; 3: no ``reward_std``."""
    log_rel = _log_std_rel(rows).to_numpy(float)
    return np.where(np.isnan(log_rel), 3, np.digitize(np.nan_to_num(log_rel), edges))


def conformal_baseline(train: pd.DataFrame, test: pd.DataFrame) -> np.ndarray:
    """Quantiles of ``test``: its raw median plus the weighted quantiles of ``train``'s misses of the raw median in
    ``reward_std`` units, within its third of ``std_rel`` (its group's edges from ``train``; module docstring)."""
    weights = source_weights(train, by=["fraction"]).to_numpy(float)
    log_rel = _log_std_rel(train)
    known = log_rel.notna().to_numpy()
    edges = [weighted_quantile(log_rel[known].to_numpy(), q, weights[known]) for q in (1 / 3, 2 / 3)]
    misses = ((train["truth"] - train[raw_column(0.5)]) / train["signal_scale"]).to_numpy(float)
    train_groups, test_groups = _signal_groups(train, edges), _signal_groups(test, edges)
    quantiles = np.empty((len(test), len(LEVELS)))
    for group in np.unique(test_groups):
        own = train_groups == group
        own = own if own.sum() >= MIN_GROUP_ROWS else np.ones(len(train), bool)
        offsets = [weighted_quantile(misses[own], learned_level(p), weights[own]) for p in LEVELS]
        rows = test_groups == group
        quantiles[rows] = test[raw_column(0.5)].to_numpy(float)[rows, None] + test["signal_scale"].to_numpy(float)[rows, None] * np.asarray(offsets)[None]
    return quantiles


#: The baselines of the model-4 issue, by the name the benchmark shows.
BASELINES: dict[str, Baseline] = {
    "linear quantile regression (reward_std units: cut, raw median change, log std_rel)": linear_quantile_baseline,
    "split-conformal (reward_std units, per std_rel third)": conformal_baseline,
}


def rescored(rows: pd.DataFrame, quantiles: np.ndarray) -> pd.DataFrame:
    """``rows`` with the forecast quantiles ``q05`` ... replaced by ``quantiles`` (rows x LEVELS) and every score that
    depends on them taken again (:mod:`evaluation.scoring`); the forecast mean and importance-sampling columns dropped."""
    out = rows.drop(columns=[c for c in ("forecast_mean", "mean_error", "pareto_k", "proposal") if c in rows]).copy()
    for j, p in enumerate(LEVELS):
        out[f"q{round(100 * p):02d}"] = quantiles[:, j]
    truth, spread = out["truth"].to_numpy(float), out["spread"].to_numpy(float)
    outcome = np.array([scoring.interval_outcome(t, lo, hi) for t, lo, hi in zip(truth, quantiles[:, 0], quantiles[:, -1])])
    middle = np.array([scoring.interval_outcome(t, lo, hi) for t, lo, hi in zip(truth, quantiles[:, 1], quantiles[:, -2])])
    out["error"] = np.abs(quantiles[:, LEVELS.index(0.5)] - truth) / spread
    out["covered_90"], out["covered_50"] = outcome == "inside", middle == "inside"
    out["above_q95"], out["below_q05"] = outcome == "above", outcome == "below"
    out["width_90"] = (quantiles[:, -1] - quantiles[:, 0]) / spread
    out["quantile_score"] = [scoring.quantile_score(t, dict(zip(LEVELS, q)), s) for t, q, s in zip(truth, quantiles, spread)]
    return out


def cross_fitted(rows: pd.DataFrame, baseline: Baseline) -> pd.DataFrame:
    """The real held-out ``rows`` (with ``fold``) scored by ``baseline``, each fold's quantiles learned on the other folds' rows.

    Raises
    ------
    BayesGrpoError
        With fewer than two folds (nothing to learn from held out), or rows without the raw forecasts' columns.
    """
    needed = ["fold", "truth", "spread", "anchor", "signal_scale", "std_rel", *map(raw_column, LEVELS)]
    missing = [c for c in needed if c not in rows]
    if missing:
        raise BayesGrpoError(f"the baselines learn from evaluation.calibration rows with {', '.join(missing)}")
    if rows["fold"].nunique() < 2:
        raise BayesGrpoError("the baselines are cross-fitted: they need rows of at least two folds")
    usable = rows[(rows["signal_scale"] > 0) & (rows["spread"] > 0)]
    parts = []
    for fold in sorted(usable["fold"].unique()):
        train, test = usable[usable["fold"] != fold], usable[usable["fold"] == fold]
        parts.append(rescored(test, baseline(train, test)))
    return pd.concat(parts).loc[[i for i in rows.index if i in usable.index]]


#: The name of the package's own layer in :func:`comparison`.
LAYER = "bayes_grpo calibration layer (the package's default)"
RAW = "raw model (no calibration)"


def comparison(raw: pd.DataFrame, calibrated: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per method and cut, on the real held-out runs, source-capped: coverage, tails, width, quantile score (and its
    ratio to the raw model's) and the largest share above q95 among the thirds of ``std_rel``.

    Methods: the raw model (``raw``: :func:`evaluation.calibration.evaluate` rows with ``fold``), the package's layer
    (``calibrated``: :func:`evaluation.calibration.cross_fitted` rows, when given) and each of :data:`BASELINES`,
    cross-fitted on ``raw`` (:func:`cross_fitted`).
    """
    real = raw[raw["set"] == "real"] if "set" in raw else raw
    methods = {RAW: real}
    if calibrated is not None:
        methods[LAYER] = calibrated[calibrated["set"] == "real"] if "set" in calibrated else calibrated
    methods |= {name: cross_fitted(real, baseline) for name, baseline in BASELINES.items()}
    reference = summarise(real, source_cap=SOURCE_CAP).set_index("fraction")["quantile_score"]
    tables = []
    for name, rows in methods.items():
        table = summarise(rows, source_cap=SOURCE_CAP)
        worst = by_signal_third(rows).query("`std rel third` != 'no reward_std'").groupby("fraction")["above_q95"].max()
        tables.append(table.assign(
            method=name, quantile_score_ratio=table["quantile_score"].to_numpy() / reference.loc[table["fraction"]].to_numpy(),
            worst_third_above_q95=worst.loc[table["fraction"]].to_numpy(),
        ))  # fmt: skip
    columns = ["method", "fraction", "runs", "weight", "coverage_90", "coverage_50", "above_q95", "below_q05", "worst_third_above_q95",
               "width_90_median", "quantile_score", "quantile_score_ratio", "error"]  # fmt: skip
    return pd.concat(tables, ignore_index=True)[columns]
