"""Do the other signals a trainer logs tell a good stop from a bad one? Replayed on the stopping backtest's pickled replays.

The stop rule judges the reward curve and its learning signal (``reward_std``). Most real logs carry more:
completion length, KL, loss, gradient norm, clipped ratio, entropy, the share of groups with no spread.
A stop leaves regret above 0.05 of the spread (``evaluation.scoring.regret``) where the run goes on
creeping up after it; if any of those signals still moves while the reward's rise is hidden in its
noise, it should tell such a check from one where the run has really stopped rising. Three questions,
on every check of the replays from 30% of the plan on (real runs, each run weighing the same in total,
each source counted as at most 3 runs):

* **Alone.** Area under the ROC curve of each signal's trend at the check, for "a stop here is bad":
  the t statistic of its least-squares slope over the last 20% of the plan, and the change of its mean
  between the two halves of that window in SDs of the window. Beside it, on the same checks, the share
  of the plan logged (the clock).
* **Added to the forecast's evidence.** A ridge-penalised logistic regression of "a stop here is bad" on
  the forecast's evidence at the check (share logged, P(plateau), P(rising), the remaining gain's median
  and 90% quantile in spreads, the reward's own trend), alone, with the signals' trends, and with what the
  log says of the run (log10 of its plan and of the share of its steps logged, of the model's size; LoRA);
  a missing value enters as 0 with an indicator. Trained on the other folds of the backtest (grouped by source),
  the rule stops at the first check from 30% whose predicted chance of a bad stop is below a bar;
  ``saved at 8% bad`` is read off the held-out trade-off curve (linear interpolation over the bars, from never stopping at the origin).
* **More runs.** The same rule trained on a random share of the other folds' sources (4 draws per
  share): if the held-out savings grew with the training runs, more logs of the same kind would help.

Writes ``stop_signals.md``.

    python benchmarks/backtest_stopping.py --cache /tmp/folds --scored real --save-replays /tmp/replays.pkl
    python benchmarks/stop_signals.py --replays /tmp/replays.pkl     # about a minute on 2 cores
"""

from __future__ import annotations

import argparse
import pickle
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from common import RESULTS, markdown, write_results_page
from direct_learners import _design, logistic_regression
from scipy.special import expit
from scipy.stats import linregress, rankdata

from bayes_grpo.settings import STOP_TOLERANCE
from bayes_grpo.stopping import MIN_STOP_FRACTION
from evaluation import backtest, scoring
from evaluation.backtest import ORACLE_REGRET, RunTrace

#: Logged signals screened (label -> canonical column of :class:`bayes_grpo.logs.RunLog`).
SIGNALS = {
    "completion length": "completions/mean_length",
    "kl": "kl",
    "loss": "loss",
    "grad norm": "grad_norm",
    "clipped ratio": "completions/clipped_ratio",
    "reward_std": "reward_std",
    "entropy": "entropy",
    "frac_reward_zero_std": "frac_reward_zero_std",
}
#: The forecast's evidence at a check (the rule's inputs) and the reward's own trend.
EVIDENCE = ("fraction", "p_plateau", "p_rising", "gain_50", "gain_90", "reward trend")
#: What the log says about the run itself: log10 of the plan, of the share of its steps logged, of the model's size; LoRA.
RUN = ("log plan", "log logged share", "log size", "lora")
#: Each signal's two trends.
SIGNAL_TRENDS = tuple(f"{label} {kind}" for label in SIGNALS for kind in ("trend", "change"))
#: The feature sets of the learned rule.
FEATURE_SETS = {
    "forecast evidence": EVIDENCE,
    "forecast evidence + logged signals": EVIDENCE + SIGNAL_TRENDS,
    "forecast evidence + the run's plan, logging, size, LoRA": EVIDENCE + RUN,
}
#: Share of the plan over which a signal's trend is measured.
TREND_WINDOW = 0.2
#: Bars on the predicted chance of a bad stop.
BARS = (0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.175, 0.2, 0.25, 0.3, 0.35, 0.4)
#: Bad-stop budget at which savings are compared (the stop target's).
BAD_BUDGET = 0.08
#: Shares of the training sources kept, and draws per share below 1.
TRAINING_SHARES = (0.25, 0.5, 0.75, 1.0)
DRAWS = 4
#: A check's window needs this many logged values of a signal.
MIN_POINTS = 5


def slope_t(steps: np.ndarray, values: np.ndarray) -> float:
    """t statistic of the least-squares slope of ``values`` on ``steps`` (NaN with too few finite points or no residual)."""
    keep = np.isfinite(values)
    if keep.sum() < MIN_POINTS or np.ptp(values[keep]) == 0:
        return float("nan")
    fit = linregress(steps[keep].astype(float), values[keep])
    return float(fit.slope / fit.stderr) if fit.stderr > 0 else float("nan")


def half_change(values: np.ndarray) -> float:
    """Change of the mean between the window's two halves, in SDs of the window (NaN with too few points)."""
    values = values[np.isfinite(values)]
    if values.size < MIN_POINTS or np.std(values) == 0:
        return float("nan")
    half = values.size // 2
    return float((values[half:].mean() - values[:half].mean()) / np.std(values))


def check_table(traces: Sequence[RunTrace]) -> pd.DataFrame:
    """One row per check from :data:`MIN_STOP_FRACTION`: label, the forecast's evidence and each signal's trends."""
    rows = []
    for tr in traces:
        run = tr.run
        steps = run.steps
        plan = run.meta.total_steps or int(steps[-1])
        window = TREND_WINDOW * plan
        described = {
            "log plan": np.log10(plan), "log logged share": np.log10(len(steps) / plan),
            "log size": np.log10(run.meta.params_b) if run.meta.params_b else float("nan"), "lora": float(bool(run.meta.extra.get("lora"))),
        }  # fmt: skip
        signals = {label: run.signal(name) for label, name in SIGNALS.items() if name in run.signals}
        for check, (index, fraction, evidence) in enumerate(zip(tr.indices, tr.fractions, tr.evidence)):
            if fraction < MIN_STOP_FRACTION - 1e-9:
                continue
            stop = steps[index]
            recent = (steps > stop - window) & (steps <= stop)
            spread = evidence.spread if evidence.spread > 0 else 1.0
            row = {
                "run_id": run.run_id, "source": tr.source, "fold": tr.fold, "check": check,
                "bad": scoring.regret(steps, run.rewards, stop) > ORACLE_REGRET,
                "fraction": fraction,
                "p_plateau": evidence.probability(STOP_TOLERANCE),
                "p_rising": evidence.rise_probability(STOP_TOLERANCE),
                "gain_50": float(np.median(evidence.gain)) / spread,
                "gain_90": float(np.quantile(evidence.gain, 0.9)) / spread,
                "reward trend": slope_t(steps[recent], run.rewards[recent]),
                **described,
            }  # fmt: skip
            for label in SIGNALS:
                values = signals[label][recent] if label in signals else np.array([])
                row[f"{label} trend"] = slope_t(steps[recent], values) if values.size else float("nan")
                row[f"{label} change"] = half_change(values) if values.size else float("nan")
            rows.append(row)
    table = pd.DataFrame(rows)
    per_source = table.groupby("source")["run_id"].transform("nunique")
    checks = table.groupby("run_id")["check"].transform("size")
    table["weight"] = np.minimum(1.0, backtest.SOURCE_CAP / per_source) / checks
    return table


def weighted_auc(label: np.ndarray, score: np.ndarray, weight: np.ndarray) -> float:
    """Area under the ROC curve with weights (ties count half): P(a bad check scores above a good one)."""
    ranks = rankdata(score)
    order = np.argsort(ranks)
    label, ranks, weight = label[order], ranks[order], weight[order]
    negative = np.where(~label, weight, 0.0)
    below = np.cumsum(negative) - negative
    tied = pd.Series(negative).groupby(ranks).transform("sum").to_numpy()
    tied_below = pd.Series(below).groupby(ranks).transform("min").to_numpy()
    wins = weight[label] @ (tied_below[label] + 0.5 * tied[label])
    return float(wins / (weight[label].sum() * negative.sum()))


def screen(table: pd.DataFrame) -> pd.DataFrame:
    """Each feature's AUC alone (oriented so that 0.5 is none), on the checks where it was logged, beside the clock's."""
    rows = []
    for column in [*EVIDENCE[1:], *SIGNAL_TRENDS]:
        part = table[table[column].notna()]
        if part["run_id"].nunique() < 10:
            continue
        label, weight = part["bad"].to_numpy(bool), part["weight"].to_numpy()
        auc = weighted_auc(label, part[column].to_numpy(), weight)
        clock = weighted_auc(label, -part["fraction"].to_numpy(), weight)
        rows.append({
            "feature": column, "runs": part["run_id"].nunique(), "sources": part["source"].nunique(), "checks": len(part),
            "auc": max(auc, 1 - auc), "a bad stop when it is": "high" if auc > 0.5 else "low", "clock's auc, same checks": clock,
        })  # fmt: skip
    return pd.DataFrame(rows)


def features(table: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """The regression's ``columns`` of ``table`` (a missing value -> 0, plus an indicator column)."""
    frame = table[list(columns)].copy()
    for column in columns:
        if frame[column].isna().any():
            frame[f"{column} missing"] = frame[column].isna().astype(float)
            frame[column] = frame[column].fillna(0.0)
    return frame.clip(-20, 20)


def held_out_probability(table: pd.DataFrame, frame: pd.DataFrame, rng: np.random.Generator, share: float = 1.0) -> np.ndarray:
    """Each check's predicted chance of a bad stop, from a regression trained on the other folds (a ``share`` of their sources)."""
    probability = np.zeros(len(table))
    for fold in sorted(table["fold"].unique()):
        held = (table["fold"] == fold).to_numpy()
        sources = table.loc[~held, "source"].unique()
        kept = rng.choice(sources, max(2, round(share * len(sources))), replace=False) if share < 1 else sources
        train = ~held & table["source"].isin(kept).to_numpy()
        mean, sd = frame[train].mean(), frame[train].std() + 1e-12
        names = list(frame.columns)
        weights = table.loc[train, "weight"].to_numpy()
        coefficients = logistic_regression(
            _design(frame[train], names, mean, sd), table.loc[train, "bad"].to_numpy(float), weights=weights / weights.mean()
        )
        probability[held] = expit(_design(frame[held], names, mean, sd) @ coefficients)
    return probability


def tradeoff(traces: Sequence[RunTrace], table: pd.DataFrame, probability: np.ndarray, label: str) -> pd.DataFrame:
    """Source-capped steps saved and bad-stop share of the rule "stop when the chance of a bad stop is below the bar"."""
    by_run = {run_id: part for run_id, part in table.assign(p=probability).groupby("run_id")}
    rows = []
    for bar in BARS:
        for tr in traces:
            decisions = np.zeros(len(tr.evidence), dtype=bool)
            part = by_run[tr.run.run_id]
            decisions[part["check"].to_numpy()] = part["p"].to_numpy() < bar
            rows.append(backtest._row(tr, label, bar, decisions))
    return backtest.summarise_source_capped(pd.DataFrame(rows))


def saved_at_budget(curve: pd.DataFrame, budget: float = BAD_BUDGET) -> float:
    """Steps saved at ``budget`` bad stops, interpolated along the trade-off curve (a bar of 0, never stopping, at the origin)."""
    points = curve.sort_values("share_regret_gt_0.05")
    return float(np.interp(budget, np.r_[0.0, points["share_regret_gt_0.05"]], np.r_[0.0, points["mean_saved"]]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replays", type=Path, required=True, help="replays pickled by backtest_stopping.py --save-replays")
    parser.add_argument("--seed", type=int, default=0, help="seed of the source draws of the training-share rows (default 0)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder to write stop_signals.md to (default benchmarks/results)")
    args = parser.parse_args()
    started = time.perf_counter()
    traces, _ = pickle.loads(args.replays.read_bytes())
    real = [tr for tr in traces if tr.set == "real"]
    table = check_table(real)
    rng = np.random.default_rng(args.seed)
    curves, learning = [], []
    for name, columns in FEATURE_SETS.items():
        frame = features(table, columns)
        curve = tradeoff(real, table, held_out_probability(table, frame, rng), name)
        curves.append(curve[["rule", "threshold", "mean_saved", "share_regret_gt_0.05", "share_dip_stops"]])
        for share in TRAINING_SHARES:
            draws = [saved_at_budget(tradeoff(real, table, held_out_probability(table, frame, rng, share), name)) for _ in range(DRAWS if share < 1 else 1)]
            learning.append({"features": name, "share of training sources": share, "saved at 8% bad, mean": np.mean(draws), "min": min(draws), "max": max(draws)})
    default = backtest.summarise_source_capped(pd.DataFrame([backtest._row(tr, "default", np.nan, tr.default) for tr in real]))
    weighted_bad = np.average(table["bad"], weights=table["weight"])
    write_results_page(
        args.out / "stop_signals.md",
        "Other logged signals at a stop check",
        time.perf_counter() - started,
        __doc__,
        [
            (
                f"{len(real)} real runs from `{args.replays.name}`, {len(table)} checks from 30% of the plan; a bad stop at "
                f"{weighted_bad:.0%} of them (weighted). The package's default rule on these replays saves "
                f"{default['mean_saved'].iloc[0]:.1%} with {default['share_regret_gt_0.05'].iloc[0]:.1%} bad stops."
            ),
            "",
            "## Each feature alone",
            "",
            markdown(screen(table)),
            "",
            "## A learned rule, held out by fold",
            "",
            markdown(pd.concat(curves).rename(columns={"threshold": "bar"})),
            "",
            "## Savings at 8% bad stops against the training runs kept",
            "",
            markdown(pd.DataFrame(learning)),
            "",
        ],
    )

if __name__ == "__main__":
    main()
