"""Ablation of GRPO's learning signal in the model: forecasts with and without it, held out by source.

Model 3.0 reads ``reward_std`` (the spread of the completions' rewards, which TRL and Unsloth
log at every step) as a covariate of a run's gain and timescale
(``bayes_grpo.prepare.learning_signal``). This benchmark measures what it adds: the same
source-grouped cross-validation as ``benchmarks/calibration.py`` (5 folds, the shared real runs
scored at 20/30/50% observed, the bundled runs in every training set), once with the signal
(``ModelConfig(learning_signal=True)``, the default) and once without it (the reward curve
alone), with each source counted as at most 3 runs, and for the hardest third (largest change
after the cut) on its own.

The other per-step signals GRPO trainers log (``frac_reward_zero_std``, per-function reward
spreads, completion length, clipped ratio, KL, entropy) are screened on the same held-out
forecasts of the model with the signal: each is read as ``learning_signal`` reads
``reward_std`` (mean over the last 10 logged steps up to 20% of the plan) and correlated,
source-capped, with what that forecast still missed (truth - forecast mean, in the run's
spreads) and with a miss above q95. A signal that explains little of what is left is not added
to the model.

Writes ``signal_ablation.md`` and ``signal_ablation.csv`` (one row per variant, set and
observed fraction) to ``--out`` (default ``benchmarks/results``).

    python benchmarks/signal_ablation.py --cache /tmp/folds      # 10 fold fits at package defaults
    BAYES_GRPO_QUICK=1 python benchmarks/signal_ablation.py --max-runs 12 --folds 3 --out /tmp/abl   # smoke test
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from common import RESULTS, add_engine_args, add_fold_fit_args, add_run_args, fit_options, markdown, provenance

from bayes_grpo import measures
from bayes_grpo.logs import RunLog
from bayes_grpo.prepare import SIGNAL_POINTS, SIGNAL_PROGRESS
from evaluation import calibration

#: The model variants compared: label -> options of ``bayes_grpo.fit`` beyond ``--draws``.
#: The model with the signal is the package default (no override), so its fold fits are the ones
#: ``calibration.py`` and ``backtest_stopping.py`` cache and reuse with the same ``--draws``.
VARIANTS = {"reward curve only": {"model_config": {"learning_signal": False}}, "with reward_std (model 3.0)": {}}
#: Figures shown per variant.
COLUMNS = ["coverage_90", "above_q95", "below_q05", "coverage_50", "quantile_score", "ratio_to_persistence", "width_90_median"]
#: Per-step signals screened beyond reward_std: label -> how the loaders name the column(s).
SCREENED = {
    "frac_reward_zero_std": ("frac_reward_zero_std",),
    "completion length": ("completion_length", "completions/mean_length"),
    "clipped ratio": ("clipped_ratio", "completions/clipped_ratio"),
    "kl": ("kl",),
    "entropy": ("entropy",),
}
#: Prefixes of per-function reward spreads (shared runs' ``reward_std__<fn>``, TRL's ``rewards/<fn>/std``).
PER_FUNCTION_STD = ("reward_std__", "rewards/")


def early_value(run: RunLog, columns: tuple[str, ...] | None = None, per_function: bool = False) -> float:
    """A signal read as ``learning_signal`` reads ``reward_std``: mean of its last logged values up to 20% of the plan.

    ``per_function``: the smallest per-function reward spread relative to the largest (how
    unequal the functions' learning signal is: a saturated format reward beside a live one).
    """
    early = run.table[run.table["step"] <= SIGNAL_PROGRESS * measures.horizon(run)]
    if per_function:
        cols = [c for c in early if c.startswith(PER_FUNCTION_STD[0]) or (c.startswith(PER_FUNCTION_STD[1]) and c.endswith("/std"))]
        if len(cols) < 2:
            return float("nan")
        spreads = early[cols].tail(SIGNAL_POINTS).mean().to_numpy(dtype=float)
        return float(np.nanmin(spreads) / max(np.nanmax(spreads), 1e-12))
    column = next((c for c in columns or () if c in early), None)
    if column is None:
        return float("nan")
    values = early[column].to_numpy(dtype=float)
    values = values[np.isfinite(values)][-SIGNAL_POINTS:]
    return float(values.mean()) if values.size >= 3 else float("nan")


def weighted_corr(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    """Weighted Pearson correlation."""
    mx, my = np.average(x, weights=w), np.average(y, weights=w)
    cov = np.average((x - mx) * (y - my), weights=w)
    return float(cov / np.sqrt(np.average((x - mx) ** 2, weights=w) * np.average((y - my) ** 2, weights=w)))


def screening(scores: pd.DataFrame, runs: dict[str, RunLog]) -> pd.DataFrame:
    """Rank correlation (source-capped weights) of each other signal with what the model with reward_std still missed."""
    real = scores[scores["set"] == "real"].copy()
    real["missed"] = (real["truth"] - real["forecast_mean"]) / real["spread"]
    real["weight"] = calibration.source_weights(real, ("fraction",))
    readers = {label: (lambda run, cols=cols: early_value(run, cols)) for label, cols in SCREENED.items()}
    readers["per-function spread ratio"] = lambda run: early_value(run, per_function=True)
    rows = []
    for label, read in readers.items():
        values = {run_id: read(run) for run_id, run in runs.items()}
        for fraction, part in real.groupby("fraction"):
            x = part["run_id"].map(values).to_numpy(dtype=float)
            keep = np.isfinite(x)
            if keep.sum() < 8 or np.ptp(x[keep]) == 0:
                rows.append({"signal": label, "fraction": fraction, "runs": int(keep.sum())})
                continue
            w = part["weight"].to_numpy()[keep]
            x = pd.Series(x[keep]).rank().to_numpy()  # ranks: the signals' units and tails differ between trainers
            rows.append({
                "signal": label, "fraction": fraction, "runs": int(keep.sum()), "sources": part.loc[keep, "source"].nunique(),
                "corr_with_missed": weighted_corr(x, part["missed"].to_numpy()[keep], w),
                "corr_with_above_q95": weighted_corr(x, part["above_q95"].to_numpy(dtype=float)[keep], w),
            })  # fmt: skip
    return pd.DataFrame(rows)


def summaries(scores: pd.DataFrame, variant: str) -> pd.DataFrame:
    """Source-capped summaries of the real runs: all of them, and the hardest third."""
    real = scores[scores["set"] == "real"]
    parts = {"real, source-capped": real, "real, hardest third, source-capped": calibration.hardest(real, source_cap=calibration.SOURCE_CAP)}
    frames = [calibration.summarise(part, source_cap=calibration.SOURCE_CAP).assign(variant=variant, set=name) for name, part in parts.items()]
    return pd.concat(frames, ignore_index=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_args(parser)
    add_engine_args(parser)
    add_fold_fit_args(parser)
    parser.add_argument("--draws", type=int, help="draws and tuning steps per chain of each fold's fit (default: the package's)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder to write the results to (default benchmarks/results)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    started = time.perf_counter()
    runs, sources = calibration.load_evaluation_runs(args.shared, bundled=not args.no_bundled, max_runs=args.max_runs, seed=args.seed)
    tables, with_signal = [], None
    for variant, overrides in VARIANTS.items():
        options = {**fit_options(args.draws, None), **overrides}
        print(f"{variant}: {len(runs)} runs, {args.folds} folds grouped by source", flush=True)
        cv = calibration.cross_validate(
            runs, sources, n_folds=args.folds, fit_options=options, seed=args.seed, n_jobs=args.jobs, cluster=args.cluster,
            progress=not args.quiet, cache_dir=args.cache, scored="real",
        )  # fmt: skip
        tables.append(summaries(cv.scores, variant))
        with_signal = cv.scores
    table = pd.concat(tables, ignore_index=True)
    screened = screening(with_signal, {r.run_id: r for r in runs})
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "signal_ablation.csv", index=False)
    lines = [
        "# GRPO's learning signal: ablation, held out by source\n",
        provenance(time.perf_counter() - started),
        f"{with_signal['run_id'].nunique()} real runs from {with_signal['source'].nunique()} sources scored, each forecast by a model "
        f"fitted without its source ({args.folds} folds grouped by source; the bundled runs train every fold). Fit options: "
        f"{fit_options(args.draws, None) or 'package defaults'}. Figures as in `calibration.md` (units of each run's 10-90% "
        "reward spread); every source counts as at most 3 runs.\n",
    ]
    for name in table["set"].unique():
        part = table[table["set"] == name].sort_values(["fraction", "variant"], kind="stable")
        lines += [f"## {name.capitalize()}\n", markdown(part[["variant", "fraction", "runs", "weight", *COLUMNS]])]
    lines += [
        "## Other signals, screened against what the model with reward_std still misses\n",
        "Each signal's mean over its last 10 logged steps up to 20% of the plan, rank-correlated (source-capped weights) with "
        "truth - forecast mean (spreads) and with a miss above q95. `reward_std` itself entered the model; a signal "
        "is worth adding only where it explains a clear share of what is left, on enough runs and sources.\n",
        markdown(screened),
    ]
    (args.out / "signal_ablation.md").write_text("\n".join(lines))
    print((args.out / "signal_ablation.md").read_text())


if __name__ == "__main__":
    main()
