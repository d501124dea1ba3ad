"""How the forecasts of one sweep's runs miss together: the coupling stored in the shipped model file (``FittedModel.sweep_coupling``).

Reads the held-out forecasts of ``benchmarks/calibration.py`` (``results/calibration_runs.csv``: every
shared real run forecast at 20, 30 and 50% of its plan by the model of the source-grouped fold that
never saw its source) and turns each run's real final into a normal score in its forecast
(``bayes_grpo.sweeps.ScoreMap`` through the forecast's 5, 25, 50, 75 and 95% quantiles, tails
continued linearly). Per share of the plan it measures, with each source counted as at most 3 runs
(averaged over 50 random picks): the scores' mean (bias), SD, and the share of their variance shared
by the runs of one source (one-way ANOVA intraclass correlation). Writes ``sweep_coupling.md`` and
``sweep_coupling.csv``; ``scripts/refit_default_model.py --coupling-from`` stores them with the fit, and
``tests/test_sweeps.py`` checks that the shipped model holds these.
``calibration_runs.csv`` is not committed (it holds per-run figures of other people's runs): run
``benchmarks/calibration.py`` first to make it.

    python benchmarks/sweep_coupling.py
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
from common import RESULTS, markdown, provenance

import bayes_grpo as bg
from bayes_grpo.sweeps import COUPLING_LEVELS, ScoreMap, SweepCoupling

LEVELS = (0.05, 0.25, 0.5, 0.75, 0.95)
QUANTILE_COLUMNS = ["q05", "q25", "q50", "q75", "q95"]


def normal_scores(calibration_runs: pd.DataFrame) -> pd.DataFrame:
    """``run_id, source, fraction, score``: each real held-out run's final as a normal score in its forecast."""
    real = calibration_runs[calibration_runs["set"] == "real"]
    scores = [ScoreMap.from_quantiles(LEVELS, row[QUANTILE_COLUMNS].to_numpy(float)).score(float(row["truth"])) for _, row in real.iterrows()]
    return real[["run_id", "source", "fraction"]].assign(score=scores).reset_index(drop=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=RESULTS / "calibration_runs.csv", help="held-out forecasts (default results/calibration_runs.csv)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder to write to (default benchmarks/results)")
    args = parser.parse_args()
    started = time.perf_counter()
    scores = normal_scores(pd.read_csv(args.runs))
    coupling = SweepCoupling.measure(scores)
    counts = scores.groupby("fraction").agg(runs=("score", "size"), sources=("source", "nunique"))
    counts["sources_with_2_runs"] = scores.groupby("fraction")["source"].agg(lambda s: int((s.value_counts() >= 2).sum()))
    quantile_columns = [f"z_q{round(100 * level):02d}" for level in COUPLING_LEVELS]
    table = pd.DataFrame(coupling.score_quantiles, columns=quantile_columns).assign(fraction=coupling.fractions, correlation=coupling.correlation)
    table = table[["fraction", *quantile_columns, "correlation"]].join(counts, on="fraction")
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "sweep_coupling.csv", index=False)
    stored = bg.default_model().sweep_coupling
    shipped = stored is not None and stored.fractions == coupling.fractions and np.allclose(
        np.r_[np.ravel(stored.score_quantiles), stored.correlation], np.r_[np.ravel(coupling.score_quantiles), coupling.correlation]
    )
    text = (
        "# Sweep coupling: how one sweep's forecasts miss together\n\n"
        f"{provenance(time.perf_counter() - started)}\n\n"
        f"From `{args.runs.name}`: the shared real runs forecast at 20, 30 and 50% of their plan by the model of the "
        "source-grouped fold that never saw their source (`benchmarks/calibration.py`). Each run's real final is a normal "
        "score z = Phi^-1(F(final)) in its forecast F (read through its 5/25/50/75/95% quantiles, tails continued "
        "linearly, kept within +-50). The table gives the quantiles of z (calibrated forecasts: -2.05, -1.64, -1.28, -0.67, 0, "
        "0.67, 1.28, 1.64, 2.05) and `correlation`, the share of the variance of the scores' normal ranks shared by the "
        "runs of one source (intraclass correlation over the sources with two or more runs); each source counts as at "
        "most 3 runs (50 random picks averaged).\n\n"
        + markdown(table, digits=2)
        + "\n\nThe shipped model file stores these figures with its fit (`FittedModel.sweep_coupling`)"
        + (" (it does now)." if shipped else " (**it does not yet: store them with `scripts/refit_default_model.py --from-fit ... --coupling-from benchmarks/results/sweep_coupling.csv`**).")
        + " Joint draws of a sweep's finals use x_i = sqrt(rho) w + sqrt(1 - rho) e_i with one shared w per draw and "
        "z_i = G^-1(Phi(x_i)), G the distribution above: a difference between two runs of one sweep is forecast with the "
        "shared part cancelled, and the sweep's finished runs inform w.\n"
    )
    (args.out / "sweep_coupling.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
