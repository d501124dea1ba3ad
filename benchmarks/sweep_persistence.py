"""Do trials that trail at a step end first? Rank persistence of the shared real sweeps, by share of the plan.

What Optuna's median pruner relies on, and what ``ForecastPruner``'s default base proposes from: a trial
whose smoothed current reward is below the median of the sweep's trials at the same share of the plan
rarely ends best. Every run of each shared real sweep (runs of one source, dataset and planned length,
at least 3 runs: ``backtest_sweeps.find_sweeps``) is cut at each share of the plan; its current reward is
the smoother's last value of the cut log (``bayes_grpo.measures.smoothed``, the "current smoothed
reward" of ``backtest_sweeps.md``), its final the smoother's last value of the whole log. A sweep whose
logs all end before its plan (one logged 235 of 55,990 planned steps) is cut at shares of its longest log,
as the stopping backtest replays a run. No model is involved. Each sweep weighs the same; ``chance`` is a
trial's share picked at random (1 / runs; the top half: the share of runs above the median final). Writes ``sweep_persistence.md`` and ``sweep_persistence.csv``.

    python benchmarks/sweep_persistence.py
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
from backtest_sweeps import find_sweeps
from common import RESULTS, markdown, provenance

from bayes_grpo import measures
from evaluation import calibration

#: Shares of the plan the sweeps are cut at.
FRACTIONS = (0.1, 0.2, 0.3, 0.5, 0.7)


def standings(sweeps: list[tuple[str, str, int, list]], fractions: tuple[float, ...] = FRACTIONS) -> pd.DataFrame:
    """One row per (sweep, share of the plan, run): its current smoothed reward, whether it trails (below the sweep's
    median then), and whether it ends best and in the top half of the sweep's finals."""
    rows = []
    for name, _, total, runs in sweeps:
        total = min(total, max(int(run.last_step) for run in runs))
        finals = {run.run_id: float(measures.smoothed(run.steps, run.rewards)[-1]) for run in runs}
        best, median_final = max(finals, key=finals.get), float(np.median(list(finals.values())))
        for fraction in fractions:
            heads = [measures.cut(run, fraction, total) for run in runs]
            current = {head.run_id: float(measures.smoothed(head.steps, head.rewards)[-1]) for head in heads}
            middle = float(np.median(list(current.values())))
            rows += [
                {"sweep": name, "runs": len(runs), "fraction": fraction, "run_id": run_id, "current": value, "trails": value < middle,
                 "ends_best": run_id == best, "ends_top_half": finals[run_id] > median_final, "final": finals[run_id]}
                for run_id, value in current.items()
            ]  # fmt: skip
    return pd.DataFrame(rows)


def persistence(table: pd.DataFrame) -> pd.DataFrame:
    """Per share of the plan, each sweep weighing the same: how often trailing and leading trials end best and in the top half."""
    rows = []
    for fraction, part in table.groupby("fraction"):
        by_sweep = part.groupby("sweep")
        trailing = by_sweep.apply(lambda g: g.loc[g["trails"], ["ends_best", "ends_top_half"]].mean(), include_groups=False)
        leading = by_sweep.apply(lambda g: g.loc[~g["trails"], ["ends_best", "ends_top_half"]].mean(), include_groups=False)
        winner_trailed = by_sweep.apply(lambda g: bool(g.loc[g["ends_best"], "trails"].any()), include_groups=False)
        chance = by_sweep.apply(lambda g: pd.Series({"best": 1 / len(g), "top_half": g["ends_top_half"].mean()}), include_groups=False)
        rows.append({
            "fraction": fraction, "sweeps": part["sweep"].nunique(), "trailing_trials": int(part["trails"].sum()),
            "trailing_end_best": float(trailing["ends_best"].mean()), "leading_end_best": float(leading["ends_best"].mean()),
            "chance_end_best": float(chance["best"].mean()),
            "trailing_end_top_half": float(trailing["ends_top_half"].mean()), "leading_end_top_half": float(leading["ends_top_half"].mean()),
            "chance_end_top_half": float(chance["top_half"].mean()),
            "sweeps_whose_winner_trailed": float(winner_trailed.mean()),
        })  # fmt: skip
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shared", type=Path, help="folder with index.csv and runs/ (default: evaluation.settings.shared_runs_dir())")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder to write the results to (default benchmarks/results)")
    args = parser.parse_args()
    started = time.perf_counter()
    runs, _ = calibration.load_evaluation_runs(args.shared, bundled=False)
    sweeps = find_sweeps(runs, calibration.shared_index(args.shared))
    if not sweeps:
        raise SystemExit("no shared sweeps found (need ../shared/external_runs with index.csv, or --shared)")
    table = persistence(standings(sweeps))
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "sweep_persistence.csv", index=False)
    names = ", ".join(f"{name} ({len(members)} runs)" for name, _, _, members in sweeps)
    text = (
        "# Rank persistence of the shared real sweeps: do trials that trail end first?\n\n"
        + provenance(time.perf_counter() - started)
        + f"\n{len(sweeps)} sweeps: {names}. Every run cut at {', '.join(f'{f:.0%}' for f in FRACTIONS)} of the plan; a trial "
        "*trails* when its smoothed current reward is below the median of its sweep's trials at that share of the plan "
        "(what Optuna's median pruner prunes). Shares are averaged over the sweeps (each weighs the same): how often a "
        "trailing / leading trial ends best or in the top half of its sweep's finals (`chance`: a trial picked at random), "
        "and the share of sweeps whose winner trailed at that point. A sweep whose logs all end before its plan is cut at "
        "shares of its longest log.\n\n"
        + markdown(table)
    )
    (args.out / "sweep_persistence.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
