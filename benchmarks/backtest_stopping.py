"""Stopping-rule backtest grouped by source, against fixed fractions, patience rules, Optuna and the hindsight oracle.

Every run (the shared external runs, plus the bundled runs, one source per generator task) is
replayed with checks every 2% of its steps from 10% on, by a model fitted
without the run's source (folds grouped by ``source_repo``); a rule stops the
run at the first check that says stop. Regret = (S at the last step - S at the
stop) / the run's 10-90% reward spread, S the Gaussian-kernel smoother of the
whole run (bandwidth 8% of its steps); see ``evaluation.backtest``.

Writes to ``benchmarks/results/``: ``backtest_stopping.md`` (tables, targets, the
command), ``backtest_stopping.csv`` (summaries by set), ``backtest_stopping_runs.csv``
(one row per run and rule), ``backtest_stopping_folds.csv``,
``backtest_stopping_noise.csv`` (the most a rule that knew where every real run stops rising could
save within each budget of bad stops made by logging noise alone) and
``backtest_tradeoff.png`` (mean steps saved against the share of runs with
regret > 0.05, across thresholds).

    python benchmarks/backtest_stopping.py                      # 5 folds, package sampler defaults
    python benchmarks/backtest_stopping.py --cluster local:2    # folds on a local Dask cluster
    python benchmarks/backtest_stopping.py --model default      # the shipped model (in-sample for its own runs)
    BAYES_GRPO_QUICK=1 python benchmarks/backtest_stopping.py --no-bundled --cache ~/.cache/bayes_grpo_backtest   # reruns skip the fold fits
    BAYES_GRPO_QUICK=1 python benchmarks/backtest_stopping.py --max-runs 12 --folds 3 --every 0.1 --out /tmp/bt   # smoke test
    python benchmarks/backtest_stopping.py --scored real --save-replays /tmp/replays.pkl   # keep every check's evidence...
    python benchmarks/backtest_stopping.py --scored real --from-replays /tmp/replays.pkl   # ...and re-score the rules without forecasts
"""

from __future__ import annotations

import argparse
import pickle
import time
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from common import RESULTS, add_engine_args, add_fold_fit_args, add_run_args, fit_options, markdown, provenance, verdict

import bayes_grpo as bg
from bayes_grpo import stopping
from bayes_grpo.config import SamplerConfig
from bayes_grpo.settings import STOP_THRESHOLD, STOP_TOLERANCE, quick_mode
from evaluation import backtest
from evaluation.calibration import SOURCE_CAP, learn_layer, load_evaluation_runs


#: Rules shown side by side (with the threshold sweep left out).
SIDE_BY_SIDE = (
    backtest.DEFAULT_RULE, backtest.NESTED_RULE, "fixed 40%", "fixed 60%", "fixed 80%", "fixed 90%", "patience 10% of the plan",
    "patience 20% of the plan", "optuna PatientPruner(5)", "optuna PatientPruner(10)", f"hindsight oracle (regret <= {backtest.ORACLE_REGRET})",
)  # fmt: skip


def targets(summary: pd.DataFrame, rule: str = backtest.DEFAULT_RULE) -> str:
    """The stopping targets for ``rule`` (default: the default rule): bad stops, steps saved, stops inside recovering dips."""
    row = summary[summary["rule"] == rule].iloc[0]
    bad, saved, dips, deep = row["share_regret_gt_0.05"], row["mean_saved"], row["share_dip_stops"], row["share_dip_stops_beyond_noise"]
    return (
        f"- regret > 0.05 in {bad:.1%} of runs (<= {backtest.MAX_BAD_SHARE:.0%}): {verdict(bad <= backtest.MAX_BAD_SHARE)}\n"
        f"- mean steps saved {saved:.1%} (>= {backtest.MIN_SAVED:.0%}): {verdict(saved >= backtest.MIN_SAVED)}\n"
        f"- stops inside a dip that recovers in {dips:.1%} of runs (none): {verdict(dips == 0)}; in a dip deeper than "
        f"{backtest.DIP_NOISE_Z:g} SDs of the smoother's noise, {deep:.1%}\n"
        f"- median regret {row['median_regret']:.3f}\n"
    )


def side_by_side(runs: pd.DataFrame, capped: pd.DataFrame) -> pd.DataFrame:
    """The rules of :data:`SIDE_BY_SIDE`, run-weighted and source-capped figures next to each other."""
    columns = {
        "mean_saved": "saved", "share_regret_gt_0.05": "regret > 0.05", "noise_bad": "bad from noise alone", "median_regret": "median regret",
        "share_dip_stops": "dip stops",
    }  # fmt: skip
    picked = [table[table["rule"].isin(SIDE_BY_SIDE)].set_index("rule")[list(columns)].rename(columns=columns) for table in (runs, capped)]
    joined = picked[0].join(picked[1], lsuffix=" (runs)", rsuffix=" (capped)")
    order = [f"{name} ({kind})" for name in columns.values() for kind in ("runs", "capped")]
    return joined.reindex([r for r in SIDE_BY_SIDE if r in joined.index])[order].reset_index()


def noise_section(frontier: pd.DataFrame, capped: pd.DataFrame) -> list[str]:
    """What logging noise leaves any rule on the real runs: its share of the default rule's bad stops, and ``frontier``, the
    most a rule that knew where every run stops rising could save (:func:`evaluation.backtest.noise_limited_frontier`)."""
    default = capped[capped["rule"] == backtest.DEFAULT_RULE].iloc[0]
    oracle = capped[capped["rule"].str.startswith("hindsight oracle")].iloc[0]
    at_budget = frontier[frontier["noise_budget"] == backtest.MAX_BAD_SHARE]
    return [
        "\n## What logging noise leaves a rule (real runs, source-capped)\n\n",
        "A stop where a run's expected reward has stopped rising can still count as bad: S at the last step and S at the stop "
        "average different logged rewards, and the noise after the stop can lift the first by more than "
        f"{backtest.ORACLE_REGRET:g} of the spread. Column `bad from noise alone` above: the mean probability of that over a rule's stops "
        "(`evaluation.scoring.noise_bad_probability`: S is linear in the rewards, so the noise part of the regret is Normal "
        "with SD the per-step noise times the norm of the difference of the smoother's weights; independent steps assumed). "
        f"The default rule's stops would count as bad in {default['noise_bad']:.1%} of the runs from noise alone, against "
        f"{default['share_regret_gt_0.05']:.1%} measured (the rest is the forecast's). The hindsight oracle saves "
        f"{oracle['mean_saved']:.1%} with no bad stop only because it knows the noise after each stop: were that noise unknown, its "
        f"stops would count as bad in {oracle['noise_bad']:.1%} of the runs.\n\n"
        "The most a rule could save within a budget of such bad stops, had it known where every run stops rising (any check "
        f"from {stopping.MIN_STOP_FRACTION:.0%} whose hindsight regret is at most {backtest.ORACLE_REGRET:g}) but not the noise after its stop "
        "(`evaluation.backtest.noise_limited_frontier`):\n\n",
        markdown(frontier.rename(columns={"noise_budget": "bad stops from noise, at most", "saved": "steps saved, at most", "stopped": "runs stopped"})),
        f"\nAt the target's {backtest.MAX_BAD_SHARE:.0%}, even that rule saves {at_budget['saved'].iloc[0]:.1%}; the target asks "
        f"{backtest.MIN_SAVED:.0%}, with forecast errors on top of the noise.\n",
    ]


def bad_stops(results: pd.DataFrame, rule: str = backtest.DEFAULT_RULE) -> pd.DataFrame:
    """The runs ``rule`` stopped above 0.05 regret or inside a dip that recovered, with the stop's reason."""
    rows = results[(results["rule"] == rule) & ((results["regret"] > backtest.ORACLE_REGRET) | results["dip_stop"])]
    shown = rows.assign(stopped_at=1.0 - rows["saved"])[["run_id", "source", "stopped_at", "regret", "stop_reason", "dip_stop", "dip_z"]]
    return shown.sort_values("regret", ascending=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(parser)
    add_engine_args(parser)
    parser.add_argument("--draws", type=int, help="draws and tuning steps per chain of each fold's fit (default: the package's)")
    parser.add_argument("--chains", type=int, help="chains per fit (default: the package's)")
    parser.add_argument("--model", help="replay with this saved model ('default': the shipped one) instead of fitting folds")
    parser.add_argument("--every", type=float, default=backtest.CHECK_EVERY, help="spacing of the checks, share of the steps (default 0.02)")
    add_fold_fit_args(parser)
    parser.add_argument(
        "--layers-from", type=Path, metavar="CSV",
        help="the calibration benchmark's held-out forecasts of the same folds (calibration_runs.csv): each fold's model gets the "
        "calibration layer learned on the other folds, so the rule is replayed on calibrated forecasts as the package makes them",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder to write the results to (default benchmarks/results)")
    parser.add_argument("--save-replays", type=Path, metavar="FILE", help="also pickle the replays (every check's evidence) to FILE")
    parser.add_argument(
        "--from-replays", type=Path, metavar="FILE",
        help="score the rules on replays pickled by --save-replays (same runs and options) instead of forecasting again",
    )  # fmt: skip
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    runs, sources = load_evaluation_runs(args.shared, bundled=not args.no_bundled, max_runs=args.max_runs, seed=args.seed)
    model = None if args.model is None else (bg.default_model() if args.model == "default" else bg.load_model(args.model))
    options = fit_options(args.draws, args.chains, args.model_config)
    sampler = SamplerConfig()
    quick = " (quick mode, BAYES_GRPO_QUICK=1)" if quick_mode() else ""
    defaults = f"package defaults, {sampler.chains} chains x {sampler.draws} draws after {sampler.tune} tuning steps{quick}"
    how = f"the given model `{args.model}` (no refit: in-sample for runs it was fitted on)" if model else f"fit options per fold: {options or defaults}"
    print(f"{len(runs)} runs from {len(set(sources.values()))} sources, {args.folds} folds grouped by source; {how}", flush=True)
    started = time.perf_counter()
    if args.from_replays is not None:
        traces, folds = pickle.loads(args.from_replays.read_bytes())
        result = backtest.rescore(traces, folds)
        how += f"; rules scored on the replays saved in `{args.from_replays.name}`"
    else:
        layers = None
        if args.layers_from is not None:
            held_out = pd.read_csv(args.layers_from)
            layers = {fold: learn_layer(held_out[held_out["fold"] != fold]) for fold in sorted(held_out["fold"].unique())}
            how += f"; each fold's forecasts calibrated by the layer learned on the other folds' held-out forecasts in `{args.layers_from.name}`"
        result = backtest.backtest(
            runs, sources, n_folds=args.folds, model=model, fit_options=options, seed=args.seed, every=args.every,
            n_jobs=args.jobs, cluster=args.cluster, progress=not args.quiet, cache_dir=args.cache, scored=args.scored, layers=layers,
        )  # fmt: skip
    if args.save_replays is not None:
        args.save_replays.write_bytes(pickle.dumps((result.traces, result.folds)))
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
        f"The default rule here (bayes_grpo.settings, bayes_grpo.stopping): no stop before {stopping.MIN_STOP_FRACTION:.0%} of the steps, "
        f"none while P(the curve rises by more than {STOP_TOLERANCE:g} x the logged 10-90% spread over the next "
        f"{stopping.RISE_WINDOW:.0%} of the steps) > {1 - STOP_THRESHOLD:.2g}; inside a dip a stop only when P(the draws get back to the best "
        f"smoothed reward before the end) < {1 - STOP_THRESHOLD:.2g}; outside one a stop when P(remaining gain < {STOP_TOLERANCE:g} x the "
        f"spread) >= {STOP_THRESHOLD:g}. `dip stops`: stops inside a dip the run recovered from (at the stop the whole run's smoothed "
        f"reward is more than {backtest.ORACLE_REGRET:g} of the spread below its best so far, and later gets back to within that of it); "
        "`dip_z`: how many SDs of the noise logging alone gives that smoothed difference the dip is deep (`evaluation.scoring.dip_noise_z`): "
        f"a dip of less than {backtest.DIP_NOISE_Z:g} is the smoother wandering on a flat log. "
        f"The paper's baseline (arXiv 2507.18014) stops at {backtest.EPOCH_FRACTION:.0%} of an epoch: {with_epoch} of the {len(runs)} runs declare "
        "their steps per epoch; for the others the run as planned is taken as one epoch, so the baseline equals the fixed fraction.\n\n",
        "![trade-off](backtest_tradeoff.png)\n\n",
    ]
    judged = [name for name in ("real, source-capped", "real") if name in tables] or ["all"]
    for name in judged:
        parts += [f"## Targets, default rule on the {name} runs\n\n", targets(tables[name]), "\n"]
        if (tables[name]["rule"] == backtest.NESTED_RULE).any():
            parts += [f"Settings chosen by nested cross-validation (see below), held-out, {name} runs:\n\n", targets(tables[name], backtest.NESTED_RULE), "\n"]
    if "real, source-capped" in tables:
        real = [tr for tr in result.traces if tr.set == "real"]
        frontier = backtest.noise_limited_frontier([tr.run for tr in real], [tr.source for tr in real])
        frontier.to_csv(args.out / "backtest_stopping_noise.csv", index=False)
        parts += [
            f"## Side by side, real runs (run-weighted, and each source counted as at most {SOURCE_CAP} runs)\n\n",
            markdown(side_by_side(tables["real"], tables["real, source-capped"])),
            *noise_section(frontier, tables["real, source-capped"]),
            "\n## Bad stops of the default rule, real runs\n\n",
            markdown(bad_stops(sets["real"])),
            "\n",
        ]
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
            f"{backtest.MAX_BAD_SHARE:.0%} of the training runs above {backtest.ORACLE_REGRET:g} regret, each source counted as at most "
            f"{SOURCE_CAP} runs (the fold figures below are weighted so too). "
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
