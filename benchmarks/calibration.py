"""Forecast calibration benchmark: cross-validation grouped by source, at 20/30/50% observed.

Every run (the shared external runs, plus the bundled runs, one source per generator task) is
cut at 20%, 30% and 50% of its planned steps and forecast to its end by a model
fitted on the other folds, with folds grouped by ``source_repo`` so that no
source is on both sides (``evaluation.calibration.cross_validate``). Scores use
``bayes_grpo.measures``; persistence and the paper-law point fit are scored on
the same cuts, and LC-PFN too when its per-run scores are given (``--lcpfn``,
written by ``benchmarks/lcpfn_baseline.py evaluate --csv``).

Every summary is given run-weighted and, for the real runs, source-capped: each source
counts as at most 3 runs (``evaluation.calibration.source_weights``), so a sweep of many runs
of one recipe does not outvote single runs of many recipes. The targets are judged on the
source-capped real runs.

Writes to ``benchmarks/results/``: ``calibration.md`` (targets, tables, forecast health:
ESS, Pareto k-hat, proposals and regime weights; fold health, the command), ``calibration.csv`` (summaries), ``calibration_runs.csv``
(one row per run and fraction), ``calibration_folds.csv`` and ``calibration.png``. With
``--from-scores`` an existing ``calibration_runs.csv`` is summarised again without fitting or
forecasting anything (only ``calibration.md``, ``calibration.csv`` and ``calibration.png`` are written).

    python benchmarks/calibration.py                                   # 5 folds, package sampler defaults
    python benchmarks/calibration.py --cluster tcp://scheduler:8786    # folds on a Dask cluster
    python benchmarks/calibration.py --cache ~/.cache/bayes_grpo_folds # keep the fold fits; a rerun only scores
    python benchmarks/calibration.py --from-scores benchmarks/results/calibration_runs.csv --out /tmp/cal   # summaries only
    BAYES_GRPO_QUICK=1 python benchmarks/calibration.py --max-runs 12 --folds 3 --out /tmp/cal   # smoke test
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import pandas as pd
from common import RESULTS, add_engine_args, add_fold_fit_args, add_run_args, fit_options, markdown, provenance, verdict

from bayes_grpo.population import MODEL_VERSION
from evaluation import baselines, calibration

COLUMNS = ["fraction", "runs", "weight", "error", "mean_error", "persistence", "paper_law", "ratio_to_persistence", "coverage_90", "coverage_50",
           "above_q95", "below_q05", "width_90_median", "quantile_score", "change_after_cut", "ess_median", "pareto_k_above_0.7"]  # fmt: skip
#: Targets at every observed fraction: the central 90% and 50% intervals' coverage, the most truths allowed above q95
#: and below q05, the largest quantile score as a multiple of the raw model's on the same runs (calibration must
#: not cost more sharpness than that), and the largest error as a multiple of persistence's.
COVERAGE_90, COVERAGE_50, TAIL_MAX = (0.87, 0.95), (0.40, 0.60), 0.08
QUANTILE_SCORE_RATIO_MAX = 1.1
PERSISTENCE_RATIO_MAX = 0.9


def targets(table: pd.DataFrame, raw: pd.DataFrame | None = None) -> list[str]:
    """The targets judged on one summary (the benchmark passes the source-capped real runs'), one line per observed fraction;
    ``raw``: the raw model's summary of the same runs, for the quantile-score ratio."""
    lines = []
    raw_scores = raw.set_index("fraction")["quantile_score"] if raw is not None else None
    for row in table.itertuples(index=False):
        checks = [
            f"90% coverage {row.coverage_90:.2f} ({COVERAGE_90[0]:.2f}-{COVERAGE_90[1]:.2f}): {verdict(COVERAGE_90[0] <= row.coverage_90 <= COVERAGE_90[1])}",
            f"above q95 {row.above_q95:.1%} (<= {TAIL_MAX:.0%}): {verdict(row.above_q95 <= TAIL_MAX)}",
            f"below q05 {row.below_q05:.1%} (<= {TAIL_MAX:.0%}): {verdict(row.below_q05 <= TAIL_MAX)}",
            f"50% coverage {row.coverage_50:.2f} ({COVERAGE_50[0]:.2f}-{COVERAGE_50[1]:.2f}): {verdict(COVERAGE_50[0] <= row.coverage_50 <= COVERAGE_50[1])}",
        ]
        if raw_scores is not None and row.fraction in raw_scores.index:
            ratio = row.quantile_score / raw_scores[row.fraction]
            checks.append(f"quantile score {row.quantile_score:.3f}, {ratio:.2f}x the raw model's (<= {QUANTILE_SCORE_RATIO_MAX:g}x): {verdict(ratio <= QUANTILE_SCORE_RATIO_MAX)}")
        else:
            checks.append(f"quantile score {row.quantile_score:.3f}")
        checks.append(
            f"error / persistence {row.ratio_to_persistence:.2f} (<= {PERSISTENCE_RATIO_MAX:g}): {verdict(row.ratio_to_persistence <= PERSISTENCE_RATIO_MAX)}"
        )
        lines.append(f"- {row.fraction:.0%} observed ({row.runs} runs counting as {row.weight:.1f}): " + "; ".join(checks))
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
    parser.add_argument("--quantity", choices=["window", "final"], default="window", help="what is scored (evaluation.calibration)")
    parser.add_argument("--lcpfn", type=Path, default=RESULTS / "lcpfn_runs.csv", help="LC-PFN per-run scores to set beside (when the file exists)")
    add_fold_fit_args(parser)
    parser.add_argument(
        "--from-scores", type=Path, metavar="CSV",
        help="summarise this calibration_runs.csv again instead of fitting and forecasting (its folder's calibration_folds.csv is shown when present)",
    )  # fmt: skip
    parser.add_argument(
        "--in-sample", type=Path, metavar="NC",
        help="instead of cross-validating, forecast every real run with this model file (fitted on them): what the model "
        "absorbs of its own training runs, by thirds of the learning signal; writes calibration_in_sample.md",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder to write the results to (default benchmarks/results)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    started = time.perf_counter()
    if args.in_sample:
        in_sample(args)
        return
    if args.from_scores:
        scores = pd.read_csv(args.from_scores)
        folds_file = args.from_scores.with_name("calibration_folds.csv")
        folds = pd.read_csv(folds_file) if folds_file.is_file() else None
        how = (
            f"{scores['run_id'].nunique()} runs scored from {scores['source'].nunique()} sources in {scores['fold'].nunique()} folds, "
            f"summarised again from `{args.from_scores}` (no fit, no forecast; the fits and forecasts are those that wrote it)"
        )
    else:
        runs, sources = calibration.load_evaluation_runs(args.shared, bundled=not args.no_bundled, max_runs=args.max_runs, seed=args.seed)
        options = fit_options(args.draws, args.chains, args.model_config)
        print(f"{len(runs)} runs from {len(set(sources.values()))} sources, {args.folds} folds grouped by source, fit options {options or 'package defaults'}", flush=True)
        cv = calibration.cross_validate(
            runs, sources, n_folds=args.folds, fit_options=options, seed=args.seed, quantity=args.quantity,
            n_jobs=args.jobs, cluster=args.cluster, progress=not args.quiet, cache_dir=args.cache, scored=args.scored,
        )  # fmt: skip
        scores, folds = cv.scores, cv.folds
        n_real = scores.loc[scores["set"] == "real", "run_id"].nunique()
        n_bundled = scores.loc[scores["set"] == "bundled", "run_id"].nunique()
        how = (
            f"{len(runs)} runs ({n_real} real runs scored, {n_bundled} bundled) from {len(set(sources.values()))} sources "
            f"in {args.folds} folds; no source is on both sides of a fold (each generator task of the bundled runs is one source). "
            f"Fit options per fold: {options or 'package defaults'}{cache_note(folds)}. Forecast quantity: `{args.quantity}` (see `evaluation.calibration`)"
        )
    seconds = time.perf_counter() - started
    lcpfn = pd.read_csv(args.lcpfn) if args.lcpfn and args.lcpfn.is_file() else None

    args.out.mkdir(parents=True, exist_ok=True)
    if not args.from_scores:
        scores.assign(model_version=MODEL_VERSION).to_csv(args.out / "calibration_runs.csv", index=False)
        folds.to_csv(args.out / "calibration_folds.csv", index=False)
    raw = scores
    layered = not args.from_scores and (scores["set"] == "real").any() and scores["fold"].nunique() > 1
    declared = pd.DataFrame()
    if layered:  # the package applies its calibration layer by default: judge that, cross-fitted, beside the raw model
        scores = calibration.cross_fitted(cv, n_jobs=args.jobs, cluster=args.cluster, progress=not args.quiet)
        scores.to_csv(args.out / "calibration_runs_calibrated.csv", index=False)
        declared = calibration.with_declared_ranges(cv, n_jobs=args.jobs, cluster=args.cluster, progress=not args.quiet)
    tables = calibration.summary_tables(scores)
    pd.concat([t.assign(set=title) for title, t in tables.items()], ignore_index=True).to_csv(args.out / "calibration.csv", index=False)
    calibration.calibration_figure(scores).savefig(args.out / "calibration.png", dpi=110)

    parts = [
        "# Forecast calibration: cross-validation grouped by source\n\n",
        provenance(seconds),
        f"\n{how}. Each run is cut at 20/30/50% of its planned steps "
        "(cuts that already reach the final window are not scored). All figures in units of each run's 10-90% reward "
        "spread: error = |forecast median - truth| (`mean_error`: of the forecast mean), truth = mean reward over the last 10% of logged steps, persistence = "
        "mean of the last 10 observed points, quantile score = mean pinball loss at q = 0.05/0.25/0.5/0.75/0.95; "
        "above q95 / below q05: share of truths above the 95% / below the 5% quantile. Run-weighted tables count every run "
        f"once; source-capped ones count each source as at most {calibration.SOURCE_CAP} runs (weight min(1, "
        f"{calibration.SOURCE_CAP} / the source's runs); `weight`: the runs the row counts as).\n\n",
        "![calibration](calibration.png)\n\n",
    ]
    if layered:
        parts.append(
            "**Calibrated forecasts.** The package applies its calibration layer by default (`bayes_grpo.recalibration`: after "
            "the cut every draw keeps the share `beta` of the change the model predicts from the persistence level, then each "
            "quantile moves by an offset per level times a yardstick of how far the forecast may be off: its 90% width plus the "
            "recent `reward_std`, and above the median also the run's excursion (how far its best logged reward lies above its "
            "level beyond what noise reaches), times the share of the plan ahead). Here each fold's model forecasts its held-out runs again with a layer learned on the "
            "*other* folds' held-out real runs (cross-fitted), so no run is scored by a layer that saw it "
            "(`calibration_runs_calibrated.csv`). Tables below are the calibrated forecasts unless they say raw.\n\n"
        )
    if calibration.REAL_CAPPED in tables:
        raw_capped = calibration.summary_tables(raw)[calibration.REAL_CAPPED] if layered else None
        parts += [f"## Targets, on the {calibration.REAL_CAPPED}\n\n", "\n".join(targets(tables[calibration.REAL_CAPPED], raw_capped)), "\n\n"]
        if layered:
            ratio = tables[calibration.REAL_CAPPED]["quantile_score"].to_numpy() / raw_capped["quantile_score"].to_numpy()
            parts += [
                "## Raw model (no calibration layer), same runs, source-capped\n\n",
                markdown(raw_capped[[c for c in COLUMNS if c in raw_capped]]),
                "\nQuantile score of the calibrated forecasts / the raw model's at "
                + " / ".join(f"{f:.0%}" for f in raw_capped["fraction"]) + ": " + " / ".join(f"{r:.2f}" for r in ratio)
                + " (target <= 1.1).\n\n",
            ]
        signal = "std_rel = mean reward_std of the last 10 logged steps before the cut / the logged rewards' 10-90% spread"
        parts += [
            f"## Truths above q95 by thirds of the learning signal (real runs, source-capped; {signal})\n\n",
            "Calibrated:\n\n", markdown(calibration.by_signal_third(scores[scores["set"] == "real"])), "\n",
            "Raw model:\n\n", markdown(calibration.by_signal_third(raw[raw["set"] == "real"])), "\n",
            "## By the plan's length (real runs, source-capped)\n\n",
            "`median_miss`: weighted median of (truth - forecast median) / spread, positive where the forecast is low. "
            "What a covariate of the plan's length did for the short plans: "
            "`docs/notes/2026-12-08-plan-length-and-near-binary-ceilings.md`.\n\n",
            markdown(calibration.by_plan_length(scores[scores["set"] == "real"])), "\n",
        ]  # fmt: skip
        real_scores = scores[scores["set"] == "real"]
        if "best_logged" in real_scores:  # scores written before the column existed (--from-scores) lack it
            parts += [
                "## How far the upper tail reaches (real runs, source-capped)\n\n",
                "In units of each run's spread, above the best reward the run had logged by the cut: where the truths went "
                "(median, 95th percentile, largest) and where the calibrated q95 lies (median, 90th percentile; `raw_`: the raw "
                "model's q95, median). A q95 well above every truth's reach is width that buys no coverage: the sharpness the "
                "calibration pays for the few late take-offs it must cover.\n\n",
                markdown(calibration.upper_reach(real_scores, raw[raw["set"] == "real"] if layered else None)), "\n",
            ]  # fmt: skip
        as_logged = scores[scores["run_id"].isin(declared["run_id"])].assign(reward_bounds="the declared runs as logged") if len(declared) else declared
        bounded = calibration.by_reward_bounds(pd.concat([scores[scores["set"] == "real"], declared, as_logged], ignore_index=True))
        if not bounded.empty:
            parts += [
                "## By where the reachable range came from (real runs, source-capped)\n\n",
                "A forecast stays within the rewards' range: a declared `reward_range`, or 0 to k inferred where the log shows "
                "0-or-k rewards (`bayes_grpo.prepare.reward_ceiling`: `reward_std` fits them at every logged step, or a step "
                "where every completion scored the highest logged mean and every mean a share of it); `none`: no range. "
                "`declared`: the runs whose whole log shows 0-or-k rewards forecast again with `reward_range=(0, k)` declared "
                "(`evaluation.calibration.with_declared_ranges`; the same fold models and layers), and `the declared runs as logged`: the "
                "same runs' forecasts without the declaration.\n\n",
                markdown(bounded[[c for c in ("reward_bounds", *COLUMNS) if c in bounded]]), "\n",
            ]  # fmt: skip
        if raw.loc[raw["set"] == "real", "fold"].nunique() > 1:
            parts += [
                "## Beside the calibrated baselines of the model-4 issue (real runs, source-capped)\n\n",
                "Two cheap ways to calibrate the raw model, learned on the same held-out raw forecasts and cross-fitted the same "
                "way (each fold's quantiles learned on the other folds' rows; `evaluation.baselines`): a linear quantile regression "
                "of the change after the cut in `reward_std` units on the cut, the raw median change and log `std_rel`, and "
                "split-conformal intervals around the raw median in `reward_std` units per third of `std_rel`. "
                "`worst_third_above_q95`: the largest share above q95 among the three thirds of `std_rel`; "
                "`quantile_score_ratio`: to the raw model's on the same runs.\n\n",
                markdown(baselines.comparison(raw, scores if layered else None)), "\n",
            ]  # fmt: skip
        parts += ["## Side by side on the real runs (run-weighted)\n\n", markdown(side_by_side(scores, lcpfn)), "\n"]
        if lcpfn is None:
            parts.append("LC-PFN: no per-run scores found (run `python benchmarks/lcpfn_baseline.py evaluate --csv benchmarks/results/lcpfn_runs.csv`).\n\n")
    for title, table in tables.items():
        parts += [f"## {title[0].upper() + title[1:]}\n\n", markdown(table[[c for c in COLUMNS if c in table]]), "\n"]
    parts += [
        "## Forecast health (importance sampling, regimes)\n\n",
        "Per observed fraction, all scored forecasts: ESS of the Pareto-smoothed weights (3,000 particles), Pareto k-hat "
        "(above 0.7: unreliable), which proposal the weights came from (`bayes_grpo.forecast.condition`), and the mean "
        "posterior weight of each regime (`Forecast.regimes`).\n\n",
        markdown(calibration.health_table(scores)), "\n",
    ]  # fmt: skip
    if folds is not None:
        parts += ["## Fold fits (sampler health)\n\n", markdown(folds), "\n"]
    text = "".join(parts)
    (args.out / "calibration.md").write_text(text)
    print(text)


def in_sample(args: argparse.Namespace) -> None:
    """The real runs forecast by a model fitted on them (raw and with its layer), by thirds of the learning signal."""
    import bayes_grpo as bg

    started = time.perf_counter()
    model = bg.load_model(args.in_sample)
    runs, sources = calibration.load_evaluation_runs(args.shared, bundled=False, max_runs=args.max_runs, seed=args.seed)
    parts = ["# In-sample check: what the model absorbs of its own training runs\n\n"]
    args.out.mkdir(parents=True, exist_ok=True)
    variants = {"raw model": False} | ({"with its calibration layer": True} if model.recalibration is not None else {})
    for name, calibrated in variants.items():
        scores = calibration.evaluate(model, runs, seed=args.seed, calibrated=calibrated)
        scores["source"], scores["set"] = scores["run_id"].map(sources), "real"
        if not calibrated:  # the raw forecasts' rows, to relearn or compare layers on (local only: they name others' runs)
            scores.to_csv(args.out / "calibration_in_sample_runs.csv", index=False)
        table = calibration.summary_tables(scores)[calibration.REAL_CAPPED]
        parts += [
            f"## {name[0].upper() + name[1:]}\n\n", markdown(table[[c for c in COLUMNS if c in table]]),
            "\nBy thirds of std_rel (source-capped):\n\n", markdown(calibration.by_signal_third(scores)), "\n",
        ]  # fmt: skip
    text = provenance(time.perf_counter() - started) + f"\nModel file: `{args.in_sample.name}` ({model.fitted_on.get('model_version')}); {len(runs)} real runs.\n\n" + "".join(parts)
    (args.out / "calibration_in_sample.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
