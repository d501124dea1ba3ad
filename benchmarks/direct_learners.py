"""Direct learners on the benchmark folds: is the missing upside in the heads at all?

The package's forecasts miss late take-offs at 20% observed and its stop rule saves
about half of the 30% of steps the stopping benchmark targets; every signal tried inside
the model left both where they were. This benchmark asks the question without the model:
two plain learners, trained straight on the quantity each benchmark scores, on the training runs of the same folds
(grouped by source, :func:`evaluation.calibration.grouped_splits`), judged on the
held-out real runs with the package's own scoring.

* **Forecasts.** Linear quantile regression (pinball loss, solved exactly as a linear
  programme by SciPy's HiGHS) of the change after the cut in units of the head's own
  10-90% spread, ``(truth - persistence) / head spread``, on features of the head; one
  regression per observed fraction and quantile (0.05 ... 0.95, sorted so they never
  cross). The constant-only regression is the "calibrated but useless" forecaster
  learned by source. Scored by :func:`evaluation.calibration.score_cut`.
* **Stopping.** Logistic regression of "stopping now leaves regret above 0.05"
  (:func:`evaluation.scoring.regret`, the stopping backtest's definition) on the same features plus
  the observed fraction, at every check of :func:`evaluation.backtest.check_indices`; the
  rule stops at the first check from 30% on whose predicted probability of a bad stop
  is below a threshold. Scored by :func:`evaluation.backtest.score`.

Features, from the head only: the rise (mean of the last 10 points minus the mean of
the first fifth), the projected gain (least-squares slope over the last 40% of the head
times the steps left; clipped to +-10), the fall below the head's smoothed best, all in
head units. Each learner is trained on all training runs (bundled and real) and on the
real ones only. The package's own rows are read from ``calibration.csv`` and
``backtest_stopping.csv``: the same folds and runs when this script runs with its
default options (``--no-bundled``, ``--max-runs``, ``--folds`` or ``--seed`` change the
learners' folds, not those rows).

    python benchmarks/direct_learners.py          # ~4 minutes on 2 cores; writes benchmarks/results/direct_learners.md
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
from scipy.optimize import minimize
from common import RESULTS, add_run_args, markdown, provenance
from scipy.special import expit

from bayes_grpo import measures
from bayes_grpo.logs import RunLog
from bayes_grpo.settings import FORECAST_QUANTILES
from bayes_grpo.stopping import MIN_STOP_FRACTION
from evaluation import calibration, scoring
from evaluation.backtest import ORACLE_REGRET, check_indices, score
from evaluation.baselines import quantile_regression
from evaluation.settings import EVALUATION_FRACTIONS

#: Feature sets of the forecast regressions (empty: the constant only).
FORECAST_FEATURES: dict[str, tuple[str, ...]] = {
    "constant": (),
    "rise": ("rise",),
    "projected gain": ("projected",),
    "rise + projected gain + fall": ("rise", "projected", "fall"),
}
#: Features of the stop classifier.
STOP_FEATURES = ("fraction", "rise", "projected", "fall")
#: Thresholds on the predicted probability of a bad stop.
STOP_THRESHOLDS = (0.1, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5)
#: Share of the head over which the recent slope is fitted.
SLOPE_SHARE = 0.4
#: Ridge penalty of the logistic regression (standardised features).
RIDGE = 1.0


def head_features(steps: np.ndarray, rewards: np.ndarray, total_steps: float) -> dict[str, float]:
    """Rise, projected gain and fall below the smoothed best of a head, in units of its own spread."""
    unit = measures.reward_spread(rewards)
    first = rewards[: max(3, len(rewards) // 5)].mean()
    recent = steps >= steps[-1] * (1 - SLOPE_SHARE)
    slope = np.polyfit(steps[recent], rewards[recent], 1)[0] if recent.sum() >= 3 else 0.0
    curve = measures.smoothed(steps, rewards, span=float(total_steps))
    return {
        "unit": unit,
        "rise": (scoring.persistence(rewards) - first) / unit,
        "projected": float(np.clip(slope * (total_steps - steps[-1]) / unit, -10, 10)),
        "fall": (curve.max() - curve[-1]) / unit,
    }


def logistic_regression(X: np.ndarray, y: np.ndarray, ridge: float = RIDGE, weights: np.ndarray | None = None) -> np.ndarray:
    """Ridge-penalised logistic regression coefficients (intercept first, not penalised); ``weights``: each row's share of the loss (default 1)."""
    weights = np.ones(len(y)) if weights is None else np.asarray(weights, dtype=float)

    def loss(w: np.ndarray) -> tuple[float, np.ndarray]:
        z = X @ w
        p = expit(z)
        penalty = np.r_[0.0, w[1:]]
        return float(weights @ (np.logaddexp(0, z) - y * z) + ridge * penalty @ penalty), X.T @ (weights * (p - y)) + 2 * ridge * penalty

    return minimize(loss, np.zeros(X.shape[1]), jac=True, method="L-BFGS-B").x


def _design(frame: pd.DataFrame, names: Sequence[str], mean: pd.Series | None = None, sd: pd.Series | None = None) -> np.ndarray:
    columns = frame[list(names)]
    if mean is not None:
        columns = (columns - mean) / sd
    return np.c_[np.ones(len(frame)), columns.to_numpy(float)]


def cut_table(runs: Sequence[RunLog]) -> pd.DataFrame:
    """Features and target (change after the cut, head units) of every scored cut of ``runs``."""
    rows = []
    for run in runs:
        total = measures.horizon(run)
        first_window_step = run.steps[-measures.final_window_size(len(run))]
        for fraction in EVALUATION_FRACTIONS:
            head = measures.cut(run, fraction, total)
            if head.last_step >= first_window_step or len(head) < 3:
                continue
            feats = head_features(head.steps.astype(float), head.rewards, total)
            change = (measures.final_reward(run.rewards) - scoring.persistence(head.rewards)) / feats["unit"]
            rows.append({"run_id": run.run_id, "fraction": fraction, "change": change, **feats})
    return pd.DataFrame(rows)


def _training(table: pd.DataFrame, train: Sequence[RunLog], sources: dict[str, str], real_only: bool) -> pd.DataFrame:
    """The rows of ``table`` that belong to the fold's training runs (the real ones only if ``real_only``)."""
    ids = {r.run_id for r in train if not (real_only and calibration.is_bundled(sources[r.run_id]))}
    return table[table["run_id"].isin(ids)]


def _quantile_predictor(coefficients: Sequence[np.ndarray], names: Sequence[str]) -> Callable[[RunLog, int, np.ndarray], tuple]:
    """A ``score_cut`` predictor: persistence plus the regressions' quantiles of the change, in head units."""

    def predict(head: RunLog, total: int, window: np.ndarray) -> tuple:
        feats = head_features(head.steps.astype(float), head.rewards, total)
        x = _design(pd.DataFrame([feats]), names)[0]
        values = scoring.persistence(head.rewards) + np.sort([x @ w for w in coefficients]) * feats["unit"]
        return float(values[2]), dict(zip(FORECAST_QUANTILES, values)), np.nan

    return predict


def forecast_scores(splits: list, cuts: pd.DataFrame, sources: dict[str, str], real_only: bool) -> pd.DataFrame:
    """Held-out scores of each quantile-regression feature set (one row per run, fraction and set)."""
    scores = []
    for _, train, test in splits:
        table = _training(cuts, train, sources, real_only)
        for name, names in FORECAST_FEATURES.items():
            for fraction, part in table.groupby("fraction"):
                coefficients = [quantile_regression(_design(part, names), part["change"].to_numpy(), q) for q in FORECAST_QUANTILES]
                predict = _quantile_predictor(coefficients, names)
                for run in test:
                    row = calibration.score_cut(run, fraction, predict)
                    if row is not None:
                        scores.append({**row, "method": name})
    return pd.DataFrame(scores)


def check_table(runs: Sequence[RunLog]) -> pd.DataFrame:
    """Features and label (a stop here has regret above 0.05) at every check of ``runs`` (planned length = last step)."""
    rows = []
    for run in runs:
        steps = run.steps.astype(float)
        for index, fraction in zip(*check_indices(run)):
            feats = head_features(steps[: index + 1], run.rewards[: index + 1], steps[-1])
            bad = scoring.regret(steps, run.rewards, steps[index]) > ORACLE_REGRET
            rows.append({"run_id": run.run_id, "index": int(index), "fraction": fraction, "bad": bad, **feats})
    return pd.DataFrame(rows)


def stop_scores(splits: list, checks_all: pd.DataFrame, sources: dict[str, str], real_only: bool) -> pd.DataFrame:
    """Held-out saved share and regret of the classifier rule at each threshold (one row per run and threshold)."""
    rows = []
    for _, train, test in splits:
        table = _training(checks_all, train, sources, real_only)
        mean, sd = table[list(STOP_FEATURES)].mean(), table[list(STOP_FEATURES)].std() + 1e-12
        w = logistic_regression(_design(table, STOP_FEATURES, mean, sd), table["bad"].to_numpy(float))
        for run in test:
            checks = checks_all[checks_all["run_id"] == run.run_id]
            p_bad = expit(_design(checks, STOP_FEATURES, mean, sd) @ w)
            for threshold in STOP_THRESHOLDS:
                stop = np.flatnonzero((p_bad < threshold) & (checks["fraction"].to_numpy() >= MIN_STOP_FRACTION))
                outcome = score(run, int(checks["index"].iloc[stop[0]]) if stop.size else None)
                rows.append({"run_id": run.run_id, "threshold": threshold, **outcome})
    return pd.DataFrame(rows)


def _stop_summary(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.groupby(["training", "threshold"]).agg(
        runs=("run_id", "size"),
        mean_saved=("saved", "mean"),
        median_regret=("regret", "median"),
        share_regret_gt_005=("regret", lambda r: float(np.mean(r > ORACLE_REGRET))),
        share_regret_gt_010=("regret", lambda r: float(np.mean(r > 0.10))),
    ).reset_index()


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: train both learners fold by fold and write the comparison."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(parser)
    parser.add_argument("--out", default=RESULTS / "direct_learners.md")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    runs, sources = calibration.load_evaluation_runs(args.shared, bundled=not args.no_bundled, max_runs=args.max_runs, seed=args.seed)
    splits = calibration.scored_splits(runs, sources, args.folds, args.seed, scored="real")
    cuts, checks = cut_table(runs), check_table(runs)
    forecasts, stops = [], []
    for training, real_only in (("all", False), ("real only", True)):
        forecasts.append(forecast_scores(splits, cuts, sources, real_only).assign(training=training))
        stops.append(stop_scores(splits, checks, sources, real_only).assign(training=training))
    forecast_table = pd.concat(
        calibration.summarise(part).assign(method=method, training=training)
        for (method, training), part in pd.concat(forecasts).groupby(["method", "training"], sort=False)
    )
    columns = ["method", "training", "fraction", "runs", "error", "persistence", "coverage_90", "coverage_50", "above_q95", "below_q05", "width_90_median", "quantile_score"]
    model = pd.read_csv(RESULTS / "calibration.csv").query("set == 'real runs'").assign(method="bayes_grpo (calibration.csv)", training="all")
    forecast_table = pd.concat([model, forecast_table])[columns]
    stop_table = _stop_summary(pd.concat(stops))
    backtest = pd.read_csv(RESULTS / "backtest_stopping.csv").query("set == 'real' and rule == 'bayes_grpo threshold'")
    seconds = time.perf_counter() - started
    text = "".join([
        "# Direct learners on the benchmark folds\n\n",
        provenance(seconds) + "\n",
        (__doc__ or "").split("\n\n    python")[0].split("\n\n", 1)[1] + "\n\n",
        f"{len(runs)} runs from {len(set(sources.values()))} sources in {args.folds} folds; held-out real runs scored.\n\n",
        "## Forecasts of the final-window reward (real runs)\n\n",
        markdown(forecast_table) + "\n\n",
        "## Stopping: classifier rule (real runs)\n\n",
        markdown(stop_table) + "\n\n",
        "The package's rule at each threshold on P(plateau) (`backtest_stopping.csv`):\n\n",
        markdown(backtest[["threshold", "runs", "mean_saved", "median_regret", "share_regret_gt_0.05", "share_regret_gt_0.10"]]) + "\n",
    ])  # fmt: skip
    print(text)
    with open(args.out, "w") as handle:
        handle.write(text)


if __name__ == "__main__":
    main()
