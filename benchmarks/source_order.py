"""rank's order against the current-reward order on every source with two or more real runs, not only the sweeps.

``backtest_sweeps.md`` compares the order of ``rank``'s table (the forecast median of each run's final) with the
order of the smoothed current reward on the shared real sweeps: 4 to 6 sweeps per cut, three of them of 3 runs,
where one swapped pair moves Kendall tau by 0.67. This benchmark asks the same question of a larger sample that
needs no new forecast: the held-out forecasts of ``benchmarks/calibration.py`` (``results/calibration_runs_calibrated.csv``:
every shared real run forecast at 20, 30 and 50% of its plan by the fold model that never saw its source, with the
calibration layer learned on the other folds), grouped by source. Within each source with two or more runs at a cut,
three orders are set against the order of the runs' true finals (the mean reward over the last 10% of the logged
steps, what the calibration benchmark scores):

* ``forecast median``: the calibrated forecast's median final, the order of ``rank``'s table with no finished trial;
* ``current smoothed reward``: the smoother's last value of the cut log (``bayes_grpo.measures.smoothed``), the
  sweeps benchmark's baseline and what Optuna's median pruner compares;
* ``persistence``: the mean of the last 10 logged rewards, the level the calibration layer's median starts from.

Each source's Kendall tau (ties in the truth dropped) weighs the same; ``top1``: the share of sources whose truly
best run each order puts first. The difference between the forecast median's tau and the current reward's gets a
90% interval from 2,000 bootstrap resamples of the sources. Runs of one source are not always a sweep (a source may
hold runs of different tasks or lengths), so this is a wider question than ranking a sweep,
but on three times as many sources. Writes ``source_order.md`` and ``source_order.csv``.

    python benchmarks/calibration.py --quiet     # makes results/calibration_runs_calibrated.csv
    python benchmarks/source_order.py
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
from backtest_sweeps import agreement
from common import RESULTS, markdown, provenance

from bayes_grpo import measures
from evaluation import calibration

#: The orders compared: column of the scored rows -> name in the tables.
ORDERS = {"q50": "forecast median", "current": "current smoothed reward", "anchor": "persistence"}
#: Bootstrap resamples of the sources for the interval of the difference in tau.
BOOTSTRAP = 2000


def with_current_reward(scores: pd.DataFrame, shared: Path | None = None) -> pd.DataFrame:
    """The real rows of ``scores`` with ``current``: the smoothed reward at each row's cut (its ``observed_step``)."""
    runs, _ = calibration.load_evaluation_runs(shared, bundled=False)
    by_id = {run.run_id: run for run in runs}
    real = scores[scores["set"] == "real"].copy()
    missing = sorted(set(real["run_id"]) - set(by_id))
    if missing:
        raise SystemExit(f"{len(missing)} scored runs are not among the shared runs (first: {missing[0]}); rerun benchmarks/calibration.py")

    def current(row: pd.Series) -> float:
        run = by_id[row["run_id"]]
        keep = run.steps <= row["observed_step"]
        return float(measures.smoothed(run.steps[keep], run.rewards[keep])[-1])

    real["current"] = real.apply(current, axis=1)
    return real


def per_source(real: pd.DataFrame) -> pd.DataFrame:
    """One row per (cut, source with two or more runs, order): Kendall tau against the true finals and the top-1 hit."""
    rows = []
    for (fraction, source), group in real.groupby(["fraction", "source"]):
        if len(group) < 2 or group["truth"].nunique() < 2:
            continue
        for column, name in ORDERS.items():
            tau, top1 = agreement(group[column], group["truth"])
            rows.append({"fraction": fraction, "source": source, "runs": len(group), "order": name,
                         "kendall_tau": float(np.nan_to_num(tau)), "top1": top1})  # fmt: skip
    return pd.DataFrame(rows)


def summary(table: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Per cut and order: sources, mean tau, top-1 share; and, for the forecast median, the bootstrap interval of its tau
    minus the current reward's and the number of sources where its tau is higher / lower (a sign test's counts)."""
    rng = np.random.default_rng(seed)
    rows = []
    for fraction, part in table.groupby("fraction"):
        taus = part.pivot(index="source", columns="order", values="kendall_tau")
        diff = (taus[ORDERS["q50"]] - taus[ORDERS["current"]]).to_numpy()
        resampled = diff[rng.integers(0, diff.size, size=(BOOTSTRAP, diff.size))].mean(axis=1)
        low, high = np.quantile(resampled, (0.05, 0.95))
        better, worse = int(np.sum(diff > 0)), int(np.sum(diff < 0))
        for name, group in part.groupby("order", sort=False):
            rows.append({"fraction": fraction, "order": name, "sources": len(group), "runs": int(group["runs"].sum()),
                         "kendall_tau": group["kendall_tau"].mean(), "top1": group["top1"].mean(),
                         "tau_minus_current_q05": low if name == ORDERS["q50"] else np.nan,
                         "tau_minus_current_q95": high if name == ORDERS["q50"] else np.nan,
                         "sources_better": better if name == ORDERS["q50"] else np.nan,
                         "sources_worse": worse if name == ORDERS["q50"] else np.nan})  # fmt: skip
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=RESULTS / "calibration_runs_calibrated.csv", help="held-out calibrated forecasts (default results/calibration_runs_calibrated.csv)")
    parser.add_argument("--shared", type=Path, help="folder with index.csv and runs/ (default: evaluation.settings.shared_runs_dir())")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder to write the results to (default benchmarks/results)")
    args = parser.parse_args()
    if not args.runs.exists():
        raise SystemExit(f"{args.runs} not found: run benchmarks/calibration.py first")
    started = time.perf_counter()
    table = summary(per_source(with_current_reward(pd.read_csv(args.runs), args.shared)))
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "source_order.csv", index=False)
    lines = []
    for fraction, part in table.groupby("fraction"):
        ranked = part.set_index("order").loc[ORDERS["q50"]]
        current = part.set_index("order").loc[ORDERS["current"]]
        lines.append(
            f"- {fraction:.0%} of the plan, {int(ranked['sources'])} sources: forecast median tau {ranked['kendall_tau']:.2f}, top-1 "
            f"{ranked['top1']:.2f}; current smoothed reward {current['kendall_tau']:.2f}, {current['top1']:.2f}; difference in tau "
            f"{ranked['kendall_tau'] - current['kendall_tau']:+.2f} (90% bootstrap interval {ranked['tau_minus_current_q05']:+.2f} to "
            f"{ranked['tau_minus_current_q95']:+.2f}); the forecast median orders {int(ranked['sources_better'])} sources better "
            f"and {int(ranked['sources_worse'])} worse, the rest alike"
        )
    text = (
        "# rank's order against the current-reward order, on every source with two or more real runs\n\n"
        + provenance(time.perf_counter() - started)
        + f"\nHeld-out calibrated forecasts from `{args.runs.name}` (each run forecast by the fold model that never saw its "
        "source). Within each source with two or more runs at a cut, each order is set against the order of the runs' true "
        "finals: Kendall tau (each source weighs the same) and `top1`, the share of sources whose best run the order puts "
        "first. `forecast median` is the order of `rank`'s table with no finished trial; `current smoothed reward` the "
        "sweeps benchmark's baseline; `persistence` the mean of the last 10 logged rewards.\n\n"
        + "\n".join(lines)
        + "\n\n"
        + markdown(table)
    )
    (args.out / "source_order.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
