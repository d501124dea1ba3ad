"""Canonical-shapes benchmark: the forecast's and the stop rule's behaviour on synthetic runs with a known future.

Each shape of ``evaluation.shapes`` (straight and concave rises, late take-offs at 40% and 60%,
a two-stage rise, an early plateau, a rise then a decline, a dip that recovers, a flat run,
a staircase) is generated at 50, 250 and 2,000 steps, with Gaussian noise of 0.03 and 0.08
on a 0-1 reward scale, three seeds each, and cut at 20, 30, 50 and 70% of its planned steps.
Every head is forecast through the public API (``model.forecast``, ``model.stop_decision``)
with the shipped model or the model file given by ``--model``, without a declared reward
range (``--declared-range`` adds the same cells with ``reward_range=(0, 1)``), and scored by
``evaluation.calibration.evaluate_run``, the calibration benchmark's scorer (truth: mean
logged reward over the final 10% of the steps). Cells run through
``bayes_grpo.parallel.map_jobs``.

Writes to ``--out`` (default ``benchmarks/results/``): ``shapes.md`` (the spec checks, met or
missed, a per-shape table at 30% and 50% observed, stop decisions at every cut, coverage by
length), ``shapes.csv`` (summary per setting, shape and cut) and ``shapes_runs.csv`` (one row
per forecast).

    python benchmarks/shapes.py                                   # shipped model, full suite (a few minutes on 2 cores)
    python benchmarks/shapes.py --model /path/to/candidate.nc --out /tmp/shapes_candidate
    python benchmarks/shapes.py --declared-range                  # also with reward_range=(0, 1)
    python benchmarks/shapes.py --quick --out /tmp/shapes         # smoke test: 50 and 250 steps, one seed
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import pandas as pd
from common import RESULTS, markdown, package_code, provenance, verdict

from bayes_grpo.model import DEFAULT_MODEL_PATH
from bayes_grpo.parallel import map_jobs
from evaluation import shapes

#: Columns of the per-shape table.
TABLE = ["shape", "fraction", "forecasts", "coverage_90", "above_q95", "below_q05", "coverage_50", "quantile_score",
         "width_90_median", "p_plateau", "p_plateau_max", "p_take_off_ahead", "p_decline", "stopped"]  # fmt: skip
#: Observed shares shown in the per-shape table.
SHOWN_CUTS = (0.3, 0.5)
QUICK_LENGTHS, QUICK_SEEDS = (50, 250), 1


def checks_text(checks: pd.DataFrame) -> str:
    """The spec checks as a markdown list: one line per check, the figure and met / missed (or reported)."""
    lines = []
    for row in checks.itertuples(index=False):
        at = "" if pd.isna(row.fraction) else f" at {row.fraction:.0%}"
        figure = f"{row.figure:.0f}" if row.check == "stops inside the dip" else f"{row.figure:.3f}"
        judged = "reported" if row.verdict == "reported" else f"(target {row.target}): {verdict(row.verdict == 'met')}"
        lines.append(f"- {row.shape}{at}, {row.check}: {figure} over {row.forecasts} forecasts {judged}")
    return "\n".join(lines) + "\n"


def setting_section(scores: pd.DataFrame, setting: str) -> list[str]:
    """Markdown of one setting: spec checks, per-shape table at 30/50%, stops at every cut, coverage by length."""
    part = scores[scores["setting"] == setting]
    summary = shapes.summarise(part, by=("shape", "fraction"))
    checks = shapes.spec_checks(part)
    counted = checks[checks["verdict"] != "reported"]
    met = int((counted["verdict"] == "met").sum())
    scale = "no reward range declared (the scale learned from the log)" if setting == "learned" else "reward_range=(0, 1) declared (rewards clipped to it)"
    stops = summary.pivot(index="shape", columns="fraction", values="stopped").reindex([s for s in shapes.SHAPES if s in set(summary["shape"])])
    stops.columns = [f"stopped at {c:.0%}" for c in stops.columns]
    dip = part[part["shape"] == "dip"]
    by_length = shapes.summarise(part[part["fraction"].isin(SHOWN_CUTS)], by=("shape", "total_steps", "fraction"))
    coverage = by_length.pivot_table(index="shape", columns=["fraction", "total_steps"], values="coverage_90", sort=False)
    coverage.columns = [f"{f:.0%}, T={t}" for f, t in coverage.columns]
    plateau = by_length.pivot_table(index="shape", columns=["fraction", "total_steps"], values="p_plateau", sort=False)
    plateau.columns = [f"{f:.0%}, T={t}" for f, t in plateau.columns]
    return [
        f"## Setting: {scale}\n\n",
        f"### Spec checks ({met} of {len(counted)} met)\n\n",
        checks_text(checks),
        "\n### Per shape at 30% and 50% observed\n\n",
        "Pooled over lengths, noise levels and seeds. coverage_90 / coverage_50: share of forecasts whose central 90% / 50% "
        "interval holds the truth; above_q95 / below_q05: the truth above q95 / below q05; quantile_score: mean pinball loss "
        "over the run's 10-90% reward spread; width_90_median: 90% width over that spread; p_plateau, p_take_off_ahead, "
        "p_decline: mean weight of each regime of `Forecast.regimes` (p_plateau_max: the largest); stopped: share of the "
        "cuts where `model.stop_decision` says stop. `flat_no_signal` logs one reward at every step from "
        f"{shapes.NO_SIGNAL_FROM:.0%} of its plan on, so its 10-90% spread is about 0 and its scores over that spread "
        "(quantile_score, width_90_median) say nothing.\n\n",
        markdown(summary[summary["fraction"].isin(SHOWN_CUTS)][TABLE]),
        "\n### Stop decisions at every cut\n\n",
        f"Share of the forecasts where the rule says stop. Dip shape: {int(dip['stop_in_dip'].sum())} stop(s) inside the dip "
        f"(progress {shapes.SHAPES['dip'].dip[0]:.2f}-{shapes.SHAPES['dip'].dip[1]:.2f}) in {len(dip)} forecasts.\n\n",
        markdown(stops.reset_index(), digits=2),
        "\n### 90% coverage by length\n\n",
        markdown(coverage.reset_index(), digits=2),
        "\n### Mean plateau weight by length\n\n",
        markdown(plateau.reset_index(), digits=2),
        "\n",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="model file to forecast with (default: the shipped model)")
    parser.add_argument("--quick", action="store_true", help=f"smoke run: lengths {QUICK_LENGTHS}, {QUICK_SEEDS} seed per cell")
    parser.add_argument("--declared-range", action="store_true", help="also forecast every cell with reward_range=(0, 1) declared")
    parser.add_argument("--shapes", nargs="+", choices=list(shapes.SHAPES), help="only these shapes (default: all)")
    parser.add_argument("--seeds", type=int, help=f"seeds per (shape, length, noise) (default {shapes.SEEDS}; {QUICK_SEEDS} with --quick)")
    parser.add_argument("--jobs", type=int, help="local worker processes (default: every CPU)")
    parser.add_argument("--cluster", metavar="ADDRESS", help="Dask scheduler address (tcp://host:8786), or local:N for a local N-worker cluster")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder to write the results to (default benchmarks/results)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    model = str(args.model.resolve()) if args.model else None
    settings = ("learned", "declared") if args.declared_range else ("learned",)
    seeds = args.seeds or (QUICK_SEEDS if args.quick else shapes.SEEDS)
    lengths = QUICK_LENGTHS if args.quick else shapes.LENGTHS
    grid = shapes.cells(args.shapes, lengths=lengths, seeds=seeds, settings=settings, model=model)
    print(f"{len(grid)} cells x {len(shapes.CUTS)} cuts, model {model or DEFAULT_MODEL_PATH}", flush=True)
    started = time.perf_counter()
    results = map_jobs(shapes.score_cell, grid, n_jobs=args.jobs, cluster=args.cluster, progress=not args.quiet, desc="shape cells")
    seconds = time.perf_counter() - started
    scores = pd.DataFrame([row for rows in results for row in rows])

    args.out.mkdir(parents=True, exist_ok=True)
    scores.to_csv(args.out / "shapes_runs.csv", index=False)
    shapes.summarise(scores).to_csv(args.out / "shapes.csv", index=False)
    parts = [
        "# Canonical shapes: forecasts and stops on runs with a known future\n\n",
        provenance(seconds),
        f"\nModel: `{model or 'the shipped model (bayes_grpo/assets/default_model.nc)'}`; package code: {package_code()}. "
        f"{len(grid)} cells: {len(set(c.shape for c in grid))} shapes (`evaluation.shapes`) x lengths {', '.join(map(str, lengths))} "
        f"x noise {', '.join(f'{n:g}' for n in shapes.NOISES)} (Gaussian, 0-1 reward scale) x {seeds} seed(s)"
        f"{' x 2 reward scales' if len(settings) > 1 else ''}, each cut at {', '.join(f'{c:.0%}' for c in shapes.CUTS)} of its planned "
        f"steps: {len(scores)} forecasts and stop decisions through `model.forecast` and `model.stop_decision`, scored by "
        "`evaluation.calibration.evaluate_run` (truth: mean logged reward over the final 10% of the steps, noise included).\n\n",
        "Shapes: " + "; ".join(f"`{s.name}` {s.description}" for s in shapes.SHAPES.values() if s.name in set(scores["shape"])) + ".\n\n",
        "Spec: the 90% interval holds the truth in at least 85% of the forecasts at 30% and 50% observed for the shapes whose "
        f"log already shows where they are going ({', '.join(shapes.SPEC_COVERED)}); the straight rise gets a plateau weight "
        "below 0.5 in every forecast at every cut; no stop inside the dip. For late take-offs and two-stage rises the mean "
        "weight given to a rise still ahead is reported.\n\n",
    ]
    for setting in settings:
        parts += setting_section(scores, setting)
    text = "".join(parts)
    (args.out / "shapes.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
