"""Forecast calibration backtest: how good are forecasts made from part of a run?

For each run and each observed fraction (20%, 30%, 50% of its logged steps) the
run is cut with :meth:`RunLog.head`, forecast to its end, and compared with what
really happened:

* **final reward** = mean of the last 10% of the run's logged rewards;
* **error** = |predicted final - final| / the run's reward spread (max - min of
  its logged rewards), so runs on different reward scales are comparable;
* **coverage** = whether the 50% / 90% central intervals of the predicted final
  contain the final;
* two baselines: **persistence** (final = mean of the last 10 observed rewards)
  and the **paper-law** least-squares point fit extrapolated to the end.

The forecast of the final is the posterior of the *mean of the expected reward
over the same last-10% steps*, plus the sampling noise of averaging those noisy
steps, so it predicts exactly the quantity it is scored against.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from bayes_grpo.curves import fit_paper_law
from bayes_grpo.errors import BayesGrpoError
from bayes_grpo.logs import RunLog

if TYPE_CHECKING:
    from bayes_grpo.model import FittedModel

FRACTIONS = (0.2, 0.3, 0.5)
PERSISTENCE_POINTS = 10


def final_window(run: RunLog) -> np.ndarray:
    """The steps whose mean reward defines a run's final reward (its last 10% of logged steps)."""
    return run.steps[-max(1, len(run.steps) // 10) :]


def final_reward(run: RunLog) -> float:
    """Mean reward over the last 10% of a run's logged steps."""
    return float(run.rewards[-max(1, len(run.rewards) // 10) :].mean())


def reward_spread(run: RunLog) -> float:
    """Max - min of a run's logged rewards (floored to avoid dividing by zero)."""
    return max(float(np.ptp(run.rewards)), 1e-9)


def horizon(run: RunLog) -> int:
    """Planned total steps of a run, else its last logged step."""
    return int(run.total_steps or run.steps[-1])


def cut(run: RunLog, fraction: float) -> RunLog:
    """The run as it looked after ``fraction`` of its logged steps (at least 3 steps)."""
    n_seen = max(3, int(round(fraction * len(run.steps))))
    return run.head(int(run.steps[n_seen - 1]))


def evaluate_run(model: "FittedModel", run: RunLog, fraction: float, *, seed: int = 0) -> dict:
    """Forecast one run from ``fraction`` of its steps and score it against its real end."""
    head = cut(run, fraction)
    window = final_window(run)
    truth, spread = final_reward(run), reward_spread(run)
    forecast = model.forecast(head, total_steps=horizon(run), seed=seed)
    level = forecast.at_steps(window).mean(axis=1)
    rng = np.random.default_rng(seed)
    noise = forecast.step_noise / np.sqrt(window.size)
    predicted = level + rng.standard_normal(level.size) * noise
    q05, q25, q50, q75, q95 = np.quantile(predicted, [0.05, 0.25, 0.5, 0.75, 0.95])
    persistence = float(head.rewards[-PERSISTENCE_POINTS:].mean())
    try:
        law = fit_paper_law(head.steps / horizon(run), head.rewards)
        paper = float(law.predict(window / horizon(run)).mean())
    except BayesGrpoError:
        paper = persistence
    return {
        "run_id": run.run_id,
        "family": run.family,
        "fraction": fraction,
        "observed_steps": int(head.steps[-1]),
        "final": truth,
        "spread": spread,
        "predicted": float(q50),
        "error": abs(q50 - truth) / spread,
        "persistence_error": abs(persistence - truth) / spread,
        "paper_law_error": abs(paper - truth) / spread,
        "covered_50": bool(q25 <= truth <= q75),
        "covered_90": bool(q05 <= truth <= q95),
        "interval_90_width": (q95 - q05) / spread,
    }


def evaluate(
    model_for: Callable[[RunLog], "FittedModel"],
    runs: Iterable[RunLog],
    fractions: Iterable[float] = FRACTIONS,
    *,
    progress: bool = True,
) -> pd.DataFrame:
    """Score forecasts of every run at every fraction; ``model_for(run)`` gives the model to use.

    Passing a function lets a cross-validated benchmark forecast each run with a
    model that never saw it.
    """
    from tqdm.auto import tqdm

    runs = list(runs)
    fractions = list(fractions)
    rows = []
    for run in tqdm(runs, desc="calibration", disable=not progress):
        model = model_for(run)
        rows.extend(evaluate_run(model, run, fraction) for fraction in fractions)
    return pd.DataFrame(rows)


def summarise(scores: pd.DataFrame) -> pd.DataFrame:
    """One row per observed fraction: mean/median errors, ratio to persistence, coverage."""
    grouped = scores.groupby("fraction")
    table = pd.DataFrame(
        {
            "runs": grouped.size(),
            "error_mean": grouped["error"].mean(),
            "error_median": grouped["error"].median(),
            "persistence_mean": grouped["persistence_error"].mean(),
            "paper_law_mean": grouped["paper_law_error"].mean(),
            "ratio_to_persistence": grouped["error"].mean() / grouped["persistence_error"].mean(),
            "coverage_50": grouped["covered_50"].mean(),
            "coverage_90": grouped["covered_90"].mean(),
            "width_90_median": grouped["interval_90_width"].median(),
        }
    )
    return table.reset_index()
