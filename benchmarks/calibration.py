"""Forecast calibration benchmark: cross-validation grouped by source, at 20/30/50% observed.

Every run (the shared external runs, plus the bundled runs, one source per generator task) is
cut at 20%, 30% and 50% of its planned steps and forecast to its end by a model
fitted on the other folds, with folds grouped by ``source_repo`` so that no
source is on both sides (``bayes_grpo.calibration.cross_validate``). Scores use
``bayes_grpo.measures``; persistence and the paper-law point fit are scored on
the same cuts, and LC-PFN too when its per-run scores are given (``--lcpfn``,
written by ``benchmarks/lcpfn_baseline.py evaluate --csv``).

Writes to ``benchmarks/results/``: ``calibration.md`` (tables, forecast health:
ESS, Pareto k-hat, proposals and regime weights; fold health, targets, the command), ``calibration.csv`` (summaries), ``calibration_runs.csv``
(one row per run and fraction), ``calibration_folds.csv`` and ``calibration.png``.

    python benchmarks/calibration.py                                   # 5 folds, package sampler defaults
    python benchmarks/calibration.py --cluster tcp://scheduler:8786    # folds on a Dask cluster
    python benchmarks/calibration.py --cache ~/.cache/bayes_grpo_folds # keep the fold fits; a rerun only scores
    BAYES_GRPO_QUICK=1 python benchmarks/calibration.py --max-runs 12 --folds 3 --out /tmp/cal   # smoke test
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import pandas as pd
from common import RESULTS, add_engine_args, add_fold_fit_args, add_run_args, fit_options, markdown, provenance, verdict

from bayes_grpo import calibration

COLUMNS = ["fraction", "runs", "error", "persistence", "paper_law", "ratio_to_persistence", "coverage_90", "coverage_50",
           "above_q95", "below_q05", "width_90_median", "quantile_score", "change_after_cut", "ess_median", "pareto_k_above_0.7"]  # fmt: skip


def targets(real: pd.DataFrame) -> list[str]:
    """Issue 11's targets, judged on the real runs' summary."""
    lines = []
    for row in real.itertuples(index=False):
        ok = 0.85 <= row.coverage_90 <= 0.95 and 0.40 <= row.coverage_50 <= 0.60 and row.above_q95 <= 0.10 and row.below_q05 <= 0.10
        lines.append(
            f"- {row.fraction:.0%} observed: 90% coverage {row.coverage_90:.2f} (0.85-0.95), 50% coverage {row.coverage_50:.2f} "
            f"(0.40-0.60), above q95 {row.above_q95:.0%} / below q05 {row.below_q05:.0%} (<= 10% each): {verdict(ok)}"
        )
        if abs(row.fraction - 0.3) < 1e-9:
            lines.append(f"- 30% observed: error / persistence {row.ratio_to_persistence:.2f} (<= 0.7): {verdict(row.ratio_to_persistence <= 0.7)}; "
                         f"quantile score {row.quantile_score:.3f} (<= 0.14): {verdict(row.quantile_score <= 0.14)}")
    return lines


def side_by_side(scores: pd.DataFrame, lcpfn: pd.DataFrame | None) -> pd.DataFrame:
    """Real runs, one row per (method, fraction), on the same (run, fraction) cuts."""
    real = scores[scores["set"] == "real"]
    rows = []
    for fraction, part in real.groupby("fraction"):
        rows.append({"method": "bayes_grpo", "fraction": fraction, **_figures(part, "error")})
        rows.append({"method": "persistence", "fraction": fraction, "runs": len(part), "error": part["persistence_error"].mean()})
        rows.append({"method": "paper-law point fit", "fraction": fraction, "runs": len(part), "error": part["paper_law_error"].mean()})
        if lcpfn is not None:
            same = lcpfn.merge(part[["run_id", "fraction"]], on=["run_id", "fraction"])
            if len(same):
                rows.append({"method": "LC-PFN (small, CPU-trained)", "fraction": fraction, **_figures(same, "error")})
    return pd.DataFrame(rows).sort_values(["fraction", "method"], kind="stable")


def _figures(part: pd.DataFrame, error: str) -> dict:
    return {
        "runs": len(part), "error": part[error].mean(), "coverage_90": part["covered_90"].mean(), "coverage_50": part["covered_50"].mean(),
        "above_q95": part["above_q95"].mean(), "below_q05": part["below_q05"].mean(), "width_90_median": part["width_90"].median(),
        "quantile_score": part["quantile_score"].mean(),
    }  # fmt: skip


def cache_note(folds: pd.DataFrame) -> str:
    """How many fold fits came from the ``--cache`` folder (the wall time then leaves their fits out)."""
    cached = int(folds["cached"].sum()) if "cached" in folds else 0
    return f" ({cached} of {len(folds)} fold fits read from the cache)" if cached else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(parser)
    add_engine_args(parser)
    parser.add_argument("--draws", type=int, help="draws and tuning steps per chain of each fold's fit (default: the package's)")
    parser.add_argument("--chains", type=int, help="chains per fit (default: the package's)")
    parser.add_argument("--quantity", choices=["window", "final"], default="window", help="what is scored (bayes_grpo.calibration)")
    parser.add_argument("--lcpfn", type=Path, default=RESULTS / "lcpfn_runs.csv", help="LC-PFN per-run scores to set beside (when the file exists)")
    add_fold_fit_args(parser)
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder to write the results to (default benchmarks/results)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    runs, sources = calibration.load_evaluation_runs(args.shared, bundled=not args.no_bundled, max_runs=args.max_runs, seed=args.seed)
    options = fit_options(args.draws, args.chains)
    print(f"{len(runs)} runs from {len(set(sources.values()))} sources, {args.folds} folds grouped by source, fit options {options or 'package defaults'}", flush=True)
    started = time.perf_counter()
    cv = calibration.cross_validate(
        runs, sources, n_folds=args.folds, fit_options=options, seed=args.seed, quantity=args.quantity,
        n_jobs=args.jobs, cluster=args.cluster, progress=not args.quiet, cache_dir=args.cache, scored=args.scored,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    lcpfn = pd.read_csv(args.lcpfn) if args.lcpfn and args.lcpfn.is_file() else None

    args.out.mkdir(parents=True, exist_ok=True)
    cv.scores.to_csv(args.out / "calibration_runs.csv", index=False)
    cv.folds.to_csv(args.out / "calibration_folds.csv", index=False)
    tables = calibration.summary_tables(cv.scores)
    pd.concat([t.assign(set=title) for title, t in tables.items()], ignore_index=True).to_csv(args.out / "calibration.csv", index=False)
    calibration.calibration_figure(cv.scores).savefig(args.out / "calibration.png", dpi=110)

    n_real = cv.scores.loc[cv.scores["set"] == "real", "run_id"].nunique()
    n_bundled = cv.scores.loc[cv.scores["set"] == "bundled", "run_id"].nunique()
    parts = [
        "# Forecast calibration: cross-validation grouped by source\n\n",
        provenance(seconds),
        f"\n{len(runs)} runs ({n_real} real runs scored, {n_bundled} bundled) from {len(set(sources.values()))} sources "
        f"in {args.folds} folds; no source is on both sides of a fold (each generator task of the bundled runs is one source). "
        f"Fit options per fold: {options or 'package defaults'}{cache_note(cv.folds)}. Each run is cut at 20/30/50% of its planned steps "
        "(cuts that already reach the final window are not scored). All figures in units of each run's 10-90% reward "
        "spread: error = |forecast mean - truth|, truth = mean reward over the last 10% of logged steps, persistence = "
        "mean of the last 10 observed points, quantile score = mean pinball loss at q = 0.05/0.25/0.5/0.75/0.95. "
        f"Forecast quantity: `{args.quantity}` (see `bayes_grpo.calibration`).\n\n",
        "![calibration](calibration.png)\n\n",
    ]
    if "real runs" in tables:
        parts += ["## Targets (issue 11) on the real runs\n\n", "\n".join(targets(tables["real runs"])), "\n\n"]
        parts += ["## Side by side on the real runs\n\n", markdown(side_by_side(cv.scores, lcpfn)), "\n"]
        if lcpfn is None:
            parts.append("LC-PFN: no per-run scores found (run `python benchmarks/lcpfn_baseline.py evaluate --csv benchmarks/results/lcpfn_runs.csv`).\n\n")
    for title, table in tables.items():
        parts += [f"## {title[0].upper() + title[1:]}\n\n", markdown(table[COLUMNS]), "\n"]
    parts += [
        "## Forecast health (importance sampling, regimes)\n\n",
        "Per observed fraction, all scored forecasts: ESS of the Pareto-smoothed weights (3,000 particles), Pareto k-hat "
        "(above 0.7: unreliable), which proposal the weights came from (`bayes_grpo.forecast.condition`), and the mean "
        "posterior weight of each regime (`Forecast.regimes`).\n\n",
        markdown(calibration.health_table(cv.scores)), "\n",
    ]  # fmt: skip
    parts += ["## Fold fits (sampler health)\n\n", markdown(cv.folds), "\n"]
    text = "".join(parts)
    (args.out / "calibration.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
