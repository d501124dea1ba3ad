"""Stopping-rule backtest grouped by source, against fixed fractions, patience rules, Optuna and the hindsight oracle.

Every run (the shared external runs, plus the bundled runs, one source per generator task) is
replayed with checks every 2% of its steps from 10% on, by a model fitted
without the run's source (folds grouped by ``source_repo``); a rule stops the
run at the first check that says stop. Regret = (S at the last step - S at the
stop) / the run's 10-90% reward spread, S the Gaussian-kernel smoother of the
whole run (bandwidth 8% of its steps); see ``bayes_grpo.backtest``.

Writes to ``benchmarks/results/``: ``backtest_stopping.md`` (tables, targets, the
command), ``backtest_stopping.csv`` (summaries by set), ``backtest_stopping_runs.csv``
(one row per run and rule), ``backtest_stopping_folds.csv`` and
``backtest_tradeoff.png`` (mean steps saved against the share of runs with
regret > 0.05, across thresholds).

    python benchmarks/backtest_stopping.py                      # 5 folds, package sampler defaults
    python benchmarks/backtest_stopping.py --cluster local:2    # folds on a local Dask cluster
    python benchmarks/backtest_stopping.py --model default      # the shipped model (in-sample for its own runs)
    BAYES_GRPO_QUICK=1 python benchmarks/backtest_stopping.py --no-bundled --cache ~/.cache/bayes_grpo_backtest   # reruns skip the fold fits
    BAYES_GRPO_QUICK=1 python benchmarks/backtest_stopping.py --max-runs 12 --folds 3 --every 0.1 --out /tmp/bt   # smoke test
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from common import RESULTS, add_engine_args, add_fold_fit_args, add_run_args, fit_options, markdown, provenance, verdict

import bayes_grpo as bg
from bayes_grpo import backtest, stopping
from bayes_grpo.calibration import SOURCE_CAP, load_evaluation_runs
from bayes_grpo.config import SamplerConfig
from bayes_grpo.settings import STOP_THRESHOLD, STOP_TOLERANCE, quick_mode


def targets(summary: pd.DataFrame, rule: str = backtest.DEFAULT_RULE) -> str:
    """The stopping targets for ``rule`` (default: the default rule): bad stops, median regret, steps saved."""
    row = summary[summary["rule"] == rule].iloc[0]
    return (
        f"- regret > 0.05 in {row['share_regret_gt_0.05']:.1%} of runs (<= 10%): {verdict(row['share_regret_gt_0.05'] <= 0.10)}\n"
        f"- median regret {row['median_regret']:.3f} (<= 0.01): {verdict(row['median_regret'] <= 0.01)}\n"
        f"- mean steps saved {row['mean_saved']:.1%} (>= 30%): {verdict(row['mean_saved'] >= 0.30)}\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(parser)
    add_engine_args(parser)
    parser.add_argument("--draws", type=int, help="draws and tuning steps per chain of each fold's fit (default: the package's)")
    parser.add_argument("--chains", type=int, help="chains per fit (default: the package's)")
    parser.add_argument("--model", help="replay with this saved model ('default': the shipped one) instead of fitting folds")
    parser.add_argument("--every", type=float, default=backtest.CHECK_EVERY, help="spacing of the checks, share of the steps (default 0.02)")
    add_fold_fit_args(parser)
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder to write the results to (default benchmarks/results)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    runs, sources = load_evaluation_runs(args.shared, bundled=not args.no_bundled, max_runs=args.max_runs, seed=args.seed)
    model = None if args.model is None else (bg.default_model() if args.model == "default" else bg.load_model(args.model))
    options = fit_options(args.draws, args.chains)
    sampler = SamplerConfig()
    quick = " (quick mode, BAYES_GRPO_QUICK=1)" if quick_mode() else ""
    defaults = f"package defaults, {sampler.chains} chains x {sampler.draws} draws after {sampler.tune} tuning steps{quick}"
    how = f"the given model `{args.model}` (no refit: in-sample for runs it was fitted on)" if model else f"fit options per fold: {options or defaults}"
    print(f"{len(runs)} runs from {len(set(sources.values()))} sources, {args.folds} folds grouped by source; {how}", flush=True)
    started = time.perf_counter()
    result = backtest.backtest(
        runs, sources, n_folds=args.folds, model=model, fit_options=options, seed=args.seed, every=args.every,
        n_jobs=args.jobs, cluster=args.cluster, progress=not args.quiet, cache_dir=args.cache, scored=args.scored,
    )  # fmt: skip
    seconds = time.perf_counter() - started

    args.out.mkdir(parents=True, exist_ok=True)
    result.results.to_csv(args.out / "backtest_stopping_runs.csv", index=False)
    result.folds.to_csv(args.out / "backtest_stopping_folds.csv", index=False)
    sets = {"real": result.results[result.results["set"] == "real"], "bundled": result.results[result.results["set"] == "bundled"], "all": result.results}
    tables = {name: backtest.summarise(part) for name, part in sets.items() if len(part)}
    if "real" in tables:  # each source counts as at most SOURCE_CAP runs: a sweep of one recipe does not outvote single runs
        tables = {"real": tables["real"], "real, source-capped": backtest.summarise_source_capped(sets["real"]), **tables}
    pd.concat([t.assign(set=name) for name, t in tables.items()], ignore_index=True).to_csv(args.out / "backtest_stopping.csv", index=False)
    shown = "real" if "real" in tables else "all"
    fig = backtest.tradeoff_figure(tables[shown], f"stopping rules on the {shown} runs ({tables[shown]['runs'].iloc[0]} runs, grouped by source)")
    fig.savefig(args.out / "backtest_tradeoff.png", dpi=110)
    plt.close(fig)

    per_check = sum(tr.seconds_per_check for tr in result.traces) / max(len(result.traces), 1)
    with_epoch = sum(r.meta.steps_per_epoch is not None for r in runs)
    parts = [
        "# Stopping-rule backtest grouped by source\n\n",
        provenance(seconds),
        f"\n{len(runs)} runs from {len(set(sources.values()))} sources in {args.folds} folds (no source on both sides); {how}. "
        f"Checks every {args.every:.0%} of each run's steps from 10% on; a rule stops at the first check that says stop. "
        "Regret = (S at the last step - S at the stop) / 10-90% reward spread, S = Gaussian-kernel smoother of the whole run "
        "(bandwidth 8% of its steps); 0 when never stopped. Saved = (last step - stop) / last step. flip_rate = share of "
        "consecutive checks whose decisions differ (one change from continue to stop counts once); share_flip_back = runs "
        f"where a stop decision was followed by a continue. Mean time per check (forecast and decisions): {per_check:.3f} s.\n\n",
        f"The default rule here: threshold {STOP_THRESHOLD:g} on P(remaining gain < {STOP_TOLERANCE:g} x the logged 10-90% spread), "
        f"no stop before {stopping.MIN_STOP_FRACTION:.0%} of the steps, a stop on a fall of more than {stopping.FALL_SPREAD:g} of the spread "
        "(bayes_grpo.settings, bayes_grpo.stopping). "
        f"The paper's baseline (arXiv 2507.18014) stops at {backtest.EPOCH_FRACTION:.0%} of an epoch: {with_epoch} of the {len(runs)} runs declare "
        "their steps per epoch; for the others the run as planned is taken as one epoch, so the baseline equals the fixed fraction.\n\n",
        f"![trade-off](backtest_tradeoff.png)\n\n## Targets, default rule on the {shown} runs\n\n",
        targets(tables[shown]),
        "\n",
    ]
    if (tables[shown]["rule"] == backtest.NESTED_RULE).any():
        parts += [f"Settings chosen by nested cross-validation (see below), held-out figures on the {shown} runs:\n\n", targets(tables[shown], backtest.NESTED_RULE), "\n"]
    for name, table in tables.items():
        capped = f" (each source counts as at most {SOURCE_CAP} runs; `weight`: the runs a row counts as)" if "source-capped" in name else ""
        parts += [f"## {name} runs{capped}\n\n", markdown(table), "\n"]
    if result.selection is not None:
        grid = backtest.selection_grid()
        parts += [
            "## Nested selection of the rule's settings\n\n",
            f"Each fold's setting is chosen on the other folds' real runs (on all runs when no fold holds real ones) among {len(grid)} settings (thresholds "
            f"{', '.join(f'{t:g}' for t in backtest.SELECTION_THRESHOLDS)}; tolerances "
            f"{', '.join(f'{t:g}' for t in backtest.SELECTION_TOLERANCES)} of the logged spread; no stop before "
            f"{', '.join(f'{f:.0%}' for f in backtest.SELECTION_MIN_FRACTIONS)} of the steps): the most steps saved with at most "
            f"{backtest.MAX_BAD_SHARE:.0%} of the training runs above {backtest.ORACLE_REGRET:g} regret. "
            f"Scored on the held-out fold, pooled: the row `{backtest.NESTED_RULE}` in the tables above, the honest estimate "
            "of choosing the rule this way. Every check's forecast is computed once and every setting is scored on the stored evidence.\n\n",
            markdown(result.selection.picks),
            "\n",
        ]
    parts += ["## Fold fits\n\n", markdown(result.folds), "\n"]
    text = "".join(parts)
    (args.out / "backtest_stopping.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
