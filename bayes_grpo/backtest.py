"""Replay finished runs step by step and score stopping rules on them.

A run is replayed as the :class:`~bayes_grpo.callback.PlateauStoppingCallback`
would see it: ``total_steps`` is the run's last logged step, checks happen every
``max(1, n // checks)`` logged points (50 checks by default) once ``min_fraction`` of the steps are done,
and each check sees only the steps logged so far (``RunLog.head``).

Scores (all computed from the full logged run, never shown to a rule):

* *smoothed reward*: trailing rolling mean over ``max(1, round(0.1 n))`` logged points;
* *spread*: max - min of the smoothed curve (per-step noise does not inflate it);
  ``regret_raw`` divides by max - min of the raw per-step rewards instead;
* *regret* of stopping at step s: (smoothed final reward - smoothed reward at s) / spread,
  signed (negative when the run got worse after s); 0 for a run the rule never stops;
* *saved*: (last step - s) / last step.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from bayes_grpo.logs import RunLog
from bayes_grpo.stopping import remaining_gain, reward_scale

SMOOTH_FRACTION = 0.1
CHECKS_PER_RUN = 50


def smoothed(rewards: np.ndarray, fraction: float = SMOOTH_FRACTION) -> np.ndarray:
    """Trailing rolling mean over ``fraction`` of the points."""
    window = max(1, int(round(fraction * len(rewards))))
    return pd.Series(np.asarray(rewards, dtype=float)).rolling(window, min_periods=1).mean().to_numpy()


def check_indices(run: RunLog, min_fraction: float = 0.1, checks: int = CHECKS_PER_RUN) -> np.ndarray:
    """Indices of the logged points at which a rule is consulted."""
    n, steps = len(run), run.steps
    every = max(1, n // checks)
    first = int(np.searchsorted(steps, min_fraction * steps[-1]))
    return np.arange(first, n, every)


def score(run: RunLog, stop_index: int | None) -> dict[str, float]:
    """regret, regret_raw, saved and stop_step of stopping ``run`` at logged index ``stop_index`` (None: never)."""
    steps = run.steps
    if stop_index is None:
        return {"stop_step": int(steps[-1]), "saved": 0.0, "regret": 0.0, "regret_raw": 0.0}
    curve = smoothed(run.rewards)
    loss = float(curve[-1] - curve[stop_index])
    spreads = float(curve.max() - curve.min()), float(run.rewards.max() - run.rewards.min())
    regret, regret_raw = (0.0 if spread <= 0 else loss / spread for spread in spreads)
    saved = float((steps[-1] - steps[stop_index]) / steps[-1])
    return {"stop_step": int(steps[stop_index]), "saved": saved, "regret": regret, "regret_raw": regret_raw}


@dataclass
class RunTrace:
    """Per-check evidence of the Bayesian rule on one run: gain draws and reward scales."""

    run: RunLog
    indices: np.ndarray
    gains: np.ndarray  # (checks, n_draws) remaining-gain draws
    scales: np.ndarray  # (checks,) reward scale for relative_to="range"
    source: str = ""

    def probabilities(self, tolerance: float) -> np.ndarray:
        """Stop probability at each check for this tolerance."""
        return np.mean(self.gains < tolerance * self.scales[:, None], axis=1)

    def stop_index(self, threshold: float, tolerance: float) -> int | None:
        """Logged index of the first check where the probability reaches ``threshold``."""
        hits = np.flatnonzero(self.probabilities(tolerance) >= threshold)
        return int(self.indices[hits[0]]) if hits.size else None


def trace(
    model: object, run: RunLog, *, source: str = "", min_fraction: float = 0.1, checks: int = CHECKS_PER_RUN, n_draws: int = 400, **forecast_kw: object
) -> RunTrace:
    """Forecast ``run`` at every check (as the callback would) and keep the gain draws (``forecast_kw``: e.g. ``drift``)."""
    run = run.with_meta(total_steps=int(run.steps[-1]))
    indices = check_indices(run, min_fraction, checks)
    gains, scales = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in indices:
            fc = model.forecast(run.head(int(run.steps[i])), n_draws=n_draws, seed=int(i), **forecast_kw)
            gains.append(remaining_gain(fc))
            scales.append(reward_scale(fc))
    return RunTrace(run, indices, np.array(gains).reshape(len(indices), -1), np.array(scales), source)


def fixed_fraction(fraction: float) -> Callable[[RunLog, np.ndarray], int | None]:
    """Baseline: stop at the first logged step >= ``fraction`` of the run."""

    def rule(run: RunLog, indices: np.ndarray) -> int | None:
        return int(np.searchsorted(run.steps, fraction * run.steps[-1]))

    return rule


def patience_rule(patience: int) -> Callable[[RunLog, np.ndarray], int | None]:
    """Baseline like ``EarlyStoppingCallback``: stop after ``patience`` checks without a new best smoothed reward."""

    def rule(run: RunLog, indices: np.ndarray) -> int | None:
        best, waited = -np.inf, 0
        for i in indices:
            value = _causal_smoothed(run.rewards, i)
            if value > best:
                best, waited = value, 0
            else:
                waited += 1
                if waited >= patience:
                    return int(i)
        return None

    return rule


def optuna_patient_rule(patience: int) -> Callable[[RunLog, np.ndarray], int | None]:
    """Baseline: Optuna's ``PatientPruner`` (no wrapped pruner) fed the smoothed reward at each check."""
    import optuna

    def rule(run: RunLog, indices: np.ndarray) -> int | None:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(direction="maximize", pruner=optuna.pruners.PatientPruner(None, patience=patience))
        trial = study.ask()
        for i in indices:
            trial.report(_causal_smoothed(run.rewards, i), step=int(run.steps[i]))
            if trial.should_prune():
                return int(i)
        return None

    return rule


def _causal_smoothed(rewards: np.ndarray, index: int) -> float:
    """The smoothed reward at ``index`` using only points up to it (what a live rule can see)."""
    window = max(1, int(round(SMOOTH_FRACTION * len(rewards))))
    return float(np.mean(rewards[max(0, index - window + 1) : index + 1]))


def baseline_rules() -> dict[str, Callable[[RunLog, np.ndarray], int | None]]:
    """The comparison rules, by name."""
    return {
        "fixed 40%": fixed_fraction(0.4),
        "fixed 80%": fixed_fraction(0.8),
        "patience 5 checks": patience_rule(5),
        "patience 10 checks": patience_rule(10),
        "optuna PatientPruner(5)": optuna_patient_rule(5),
        "optuna PatientPruner(10)": optuna_patient_rule(10),
    }


def evaluate(traces: Iterable[RunTrace], thresholds: Iterable[float], tolerances: Iterable[float]) -> pd.DataFrame:
    """One row per (run, rule): rule, threshold, tolerance and the :func:`score` fields."""
    rows = []
    baselines = baseline_rules()
    for tr in traces:
        base = {"run_id": tr.run.run_id, "source": tr.source, "n_points": len(tr.run)}
        for tol in tolerances:
            for thr in thresholds:
                rows.append({**base, "rule": "bayes", "threshold": thr, "tolerance": tol, **score(tr.run, tr.stop_index(thr, tol))})
        for name, rule in baselines.items():
            rows.append({**base, "rule": name, "threshold": np.nan, "tolerance": np.nan, **score(tr.run, rule(tr.run, tr.indices))})
    return pd.DataFrame(rows)


def summarise(results: pd.DataFrame, by: list[str] | None = None) -> pd.DataFrame:
    """Mean saved, median regret and share of runs with regret > 0.05, per rule (and threshold/tolerance)."""
    by = by or ["rule", "threshold", "tolerance"]
    grouped = results.groupby(by, dropna=False)
    return pd.DataFrame(
        {
            "runs": grouped.size(),
            "mean_saved": grouped["saved"].mean(),
            "median_regret": grouped["regret"].median(),
            "share_regret_gt_0.05": grouped["regret"].apply(lambda r: float(np.mean(r > 0.05))),
            "median_regret_raw": grouped["regret_raw"].median(),
            "share_regret_raw_gt_0.05": grouped["regret_raw"].apply(lambda r: float(np.mean(r > 0.05))),
            "share_stopped": grouped["saved"].apply(lambda s: float(np.mean(s > 0))),
        }
    ).reset_index()
