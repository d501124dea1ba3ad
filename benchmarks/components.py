"""How well the model forecasts one reward function, beside the summed reward, on the shared real runs.

The shipped population was fitted on summed rewards. This benchmark forecasts, on the
shared runs whose log holds per-function means of two or more reward functions, the
correctness-type function (a name with ``correct``, ``accura``, ``answer`` or ``mc_idx``:
the reward people train for) as a run of its own (``RunLog.with_metric``) and the summed
reward of the same runs, at 20/30/50% of the planned steps, each on a scale learned from
its log (no declared range), and scores both with ``evaluation.calibration.evaluate_run``
(coverage, tails, quantile score, error / persistence, in units of each curve's own
10-90% spread). Summaries are source-capped (each source counts as at most 3 runs,
``evaluation.calibration.summarise``).

Two modes:

* ``--mode cv`` (default): cross-validation grouped by source, reusing
  ``evaluation.calibration.grouped_splits`` and ``cached_fit_fold`` (the calibration
  benchmark's folds, on every shared and bundled run); each fold's model forecasts its
  held-out runs. ``--draws N`` shortens the fold fits.
* ``--mode shipped``: the shipped model, no refit. It was fitted on these runs' summed
  rewards, so the summed reward's figures are in-sample (optimistic); the functions' curves
  were never fitted on.

Writes ``components.md`` and ``components.csv`` (summaries) to ``--out``; the per-run scores
(``components_runs.csv``) name others' runs and stay local.

    python benchmarks/components.py --mode shipped
    python benchmarks/components.py --mode cv --draws 300 --folds 5 --cache ~/.cache/bayes_grpo_folds
"""

from __future__ import annotations

import argparse
import re
import time
import warnings
from pathlib import Path

import pandas as pd
from common import RESULTS, add_run_args, fit_options, markdown, package_code, provenance

from bayes_grpo.components import reward_functions
from bayes_grpo.logs import RunLog
from bayes_grpo.model import default_model
from evaluation import calibration
from evaluation.settings import EVALUATION_FRACTIONS

#: A reward function whose name matches this is the correctness-type one: what the run trains for.
CORRECTNESS = re.compile(r"correct|accura|answer|mc_idx", re.IGNORECASE)
#: A correctness function whose whole-run 10-90% spread is at most this never moved: spread-scaled scores say nothing.
FLAT_SPREAD = 1e-6
COLUMNS = ["target", "fraction", "runs", "weight", "coverage_90", "coverage_50", "above_q95", "below_q05",
           "width_90_median", "quantile_score", "error", "persistence", "ratio_to_persistence"]  # fmt: skip


def correctness_function(run: RunLog) -> str | None:
    """The run's correctness-type reward function, when it logs two or more functions and one matches."""
    functions = reward_functions(run)
    matches = [f for f in functions if CORRECTNESS.search(f)]
    return matches[0] if len(functions) >= 2 and matches else None


def score(model, run: RunLog, function: str, seed: int) -> list[dict]:
    """Scores of the summed reward and of ``function`` at every evaluated fraction."""
    rows = []
    for target, part in (("summed reward", run), ("correctness function", run.with_metric(f"rewards/{function}/mean"))):
        for fraction in EVALUATION_FRACTIONS:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                row = calibration.evaluate_run(model, part, fraction, seed=calibration.run_seed(seed, run.run_id))
            if row is not None:
                rows.append({**row, "target": target, "function": function})
    return rows


def sparse_evaluation(model, runs: list[RunLog], every: int = 50, cuts: tuple[int, ...] = (150, 200), seed: int = 0) -> pd.DataFrame:
    """A sparse evaluation metric on the bundled runs: the correctness mean read every ``every`` steps only.

    No bundled run logs an evaluation metric, so each run's ``rewards/correctness/mean`` at every
    ``every``-th step stands in for one (``eval_correctness``, read through ``read_log(metric=...)``;
    it carries a training batch's noise, more than a fixed evaluation set would). Forecast from
    the evaluations up to each cut; the truth is the logged evaluation at the last step.
    """
    from bayes_grpo.logs import read_log

    rows = []
    for run in runs:
        table = run.table[["step", "reward", "rewards/correctness/mean"]].copy()
        table["eval_correctness"] = table["rewards/correctness/mean"].where(table["step"] % every == 0)
        sparse = read_log(table, metric="eval_correctness", total_steps=run.total_steps, run_id=run.run_id)
        truth = float(sparse.rewards[-1])
        for at in cuts:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fc = model.forecast(sparse.head(at), seed=calibration.run_seed(seed, run.run_id))
            lo, hi = fc.final.interval(0.9)
            rows.append({"run_id": run.run_id, "cut": at, "evaluations_seen": len(sparse.head(at)), "truth": truth,
                         "q05": lo, "q95": hi, "covered_90": lo <= truth <= hi, "width_90": hi - lo})  # fmt: skip
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("cv", "shipped"), default="cv")
    parser.add_argument("--draws", type=int, help="draws and tuning steps of each fold fit (default: the package's)")
    parser.add_argument("--chains", type=int)
    parser.add_argument("--cache", type=Path, help="folder of cached fold fits (shared with calibration.py)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--from-scores", type=Path, metavar="DIR", help="summarise the per-run scores a run left in DIR again, forecasting nothing")
    parser.add_argument("--note", default="", help="a sentence on the code that ran, written into the results (e.g. a copy outside git)")
    add_run_args(parser)
    args = parser.parse_args()
    start = time.time()
    if args.from_scores:
        scores = pd.read_csv(args.from_scores / "components_runs.csv")
        sparse = pd.read_csv(args.from_scores / "components_sparse_runs.csv")
        folds_file = args.from_scores / "components_folds.csv"
        folds = pd.read_csv(folds_file).to_dict("records") if folds_file.is_file() else []
        write(scores, sparse, folds, args, start)
        return
    runs, sources = calibration.load_evaluation_runs(args.shared, bundled=not args.no_bundled, max_runs=args.max_runs, seed=args.seed)
    chosen = {r.run_id: f for r in runs if not calibration.is_bundled(sources[r.run_id]) and (f := correctness_function(r))}
    rows, folds = [], []
    if args.mode == "shipped":
        model = default_model()
        for run in runs:
            if run.run_id in chosen:
                rows += score(model, run, chosen[run.run_id], args.seed)
    else:
        options = fit_options(args.draws, args.chains)
        for fold, (train, test) in enumerate(calibration.grouped_splits(runs, sources, args.folds, seed=args.seed)):
            held_out = [run for run in test if run.run_id in chosen]
            if not held_out:
                continue
            model, cached = calibration.cached_fit_fold(train, options, args.seed + fold, args.cache)
            folds.append({"fold": fold, "train_runs": len(train), "scored_runs": len(held_out), "cached": cached, **calibration.fold_health(model)})
            for run in held_out:
                rows += [{**row, "fold": fold} for row in score(model, run, chosen[run.run_id], args.seed)]
            print(f"fold {fold}: {len(held_out)} runs scored ({time.time() - start:.0f} s)", flush=True)
    scores = pd.DataFrame(rows)
    scores["source"] = scores["run_id"].map(sources)
    args.out.mkdir(parents=True, exist_ok=True)
    scores.to_csv(args.out / "components_runs.csv", index=False)
    if folds:
        pd.DataFrame(folds).to_csv(args.out / "components_folds.csv", index=False)
    bundled = [r for r in runs if calibration.is_bundled(sources[r.run_id])]
    sparse = sparse_evaluation(default_model(), bundled, seed=args.seed)
    sparse.to_csv(args.out / "components_sparse_runs.csv", index=False)
    write(scores, sparse, folds, args, start)


def write(scores: pd.DataFrame, sparse: pd.DataFrame, folds: list[dict], args: argparse.Namespace, start: float) -> None:
    """Summaries to ``components.md`` and ``components.csv`` (and the sparse metric's to ``components_sparse.csv``)."""
    function_rows = scores[scores["target"] == "correctness function"]
    spread = function_rows.groupby("run_id")["spread"].first()
    flat = set(spread.index[spread <= FLAT_SPREAD])
    moved = scores[~scores["run_id"].isin(flat)]
    summary = calibration.summarise(moved, by=("target", "fraction"), source_cap=calibration.SOURCE_CAP)
    summary = summary[[c for c in COLUMNS if c in summary.columns]]
    summary.to_csv(args.out / "components.csv", index=False)
    flat_rows = function_rows[function_rows["run_id"].isin(flat)]
    functions = function_rows.groupby("run_id")["function"].first().value_counts()
    how = (
        f"cross-validation grouped by source, {args.folds} folds ({len(folds)} with a scored run), fold fits "
        + (f"with {args.draws} draws and {args.draws} tuning steps per chain" if args.draws else "at the package's sampler defaults")
        if args.mode == "cv"
        else "the shipped model, no refit: it was fitted on these runs' summed rewards, so the summed reward's "
        "figures are in-sample (optimistic); the functions' curves were never fitted on"
    )
    n_runs, n_sources = scores["run_id"].nunique(), scores["source"].nunique()
    text = [
        "# Forecasting one reward function (shared real runs)\n",
        f"Generated by `benchmarks/components.py`. {n_runs} shared runs from {n_sources} sources log the means of two or "
        "more reward functions, one of them correctness-type; each is forecast as its correctness function alone and as "
        "its summed reward, from 20/30/50% of its planned steps, on a scale learned from its log. "
        f"Model: {how}. Scores in units of each curve's own 10-90% spread; source-capped (a source counts as at most 3 runs).\n",
        f"In {len(flat)} of the {n_runs} runs the correctness function never moved (the same value at every step, so it has no "
        "spread to score in); the table leaves those runs out for both targets. Their flat truth lay inside the 90% interval "
        f"in {flat_rows['covered_90'].mean():.0%} of their {len(flat_rows)} forecasts.\n" if flat else "",
        markdown(summary),
        "\nFunctions scored: " + ", ".join(f"`{name}` ({n} runs)" for name, n in functions.items()) + ".\n",
    ]
    if folds:
        text += ["\n## Folds\n", markdown(pd.DataFrame(folds))]
    table = sparse.groupby("cut").agg(
        runs=("run_id", "size"), evaluations_seen=("evaluations_seen", "first"), coverage_90=("covered_90", "mean"),
        above_q95=("truth", lambda t: float((t > sparse.loc[t.index, "q95"]).mean())),
        below_q05=("truth", lambda t: float((t < sparse.loc[t.index, "q05"]).mean())),
        width_90_median=("width_90", "median"),
    ).reset_index()  # fmt: skip
    table.to_csv(args.out / "components_sparse.csv", index=False)
    text += [
        "\n## A sparse evaluation metric (bundled runs)\n",
        f"No bundled run logs an evaluation metric, so each of the {sparse['run_id'].nunique()} bundled runs' correctness mean "
        "read at every 50th step only stands in for one (`eval_correctness`, 6 values over 300 steps, read through "
        "`read_log(metric=...)`). It carries a training batch's noise, more than a fixed evaluation set would. "
        "The shipped model (fitted on these runs' summed rewards, never on their correctness curves) forecasts it "
        "from the evaluations up to each cut; the truth is the evaluation at step 300. Width in the metric's units (0 to 1).\n",
        markdown(table),
        f"\n{provenance(time.time() - start)}",
        f"Package code: {package_code()}. {args.note}\n",
    ]
    (args.out / "components.md").write_text("\n".join(text))
    print(summary.to_string(index=False))


if __name__ == "__main__":
    main()
