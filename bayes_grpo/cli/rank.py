"""``bayes-grpo rank``: rank the runs of a sweep by their forecast final reward (probability of ending best)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from bayes_grpo.cli._common import (
    EXIT_OK,
    MIN_SCALE_STEPS,
    _add_metric_args,
    _add_run_metadata_args,
    _advice_wording,
    _caveats_printed,
    _check_plot_file,
    _finite_float,
    _metric,
    _non_negative_int,
    _reward_range,
    _warn,
)
from bayes_grpo.cli._loading import _load_model, _load_runs
from bayes_grpo.errors import BayesGrpoError

if TYPE_CHECKING:
    from bayes_grpo.logs import RunLog

NAME = "rank"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "rank",
        help="rank the runs of a sweep by their forecast final reward (probability of ending best)",
        description="Forecast every run of a sweep to --total-steps (as 'bayes-grpo forecast' does, calibrated) and print "
        "one row per run, best first by the median final q50: the step it has reached, its forecast final reward (mean, "
        "q05, q50, q95) and p_best, the probability that it ends highest of the runs given (from joint draws of the runs "
        "as one sweep).",
    )
    parser.add_argument("logs", nargs="+", metavar="LOG", help="log files, folders of logs or glob patterns (quoted, e.g. 'runs/*.csv'); at least two runs")
    parser.add_argument("--at", type=_non_negative_int, metavar="STEP", help="rank the runs as they were at STEP")
    parser.add_argument("--beat", type=_finite_float, metavar="VALUE", help="add p_beats: the probability of ending above VALUE")
    parser.add_argument("--model", metavar="FILE", help="a model file saved by 'bayes-grpo fit' (default: the shipped model)")
    parser.add_argument("--plot", metavar="FILE", help="also draw every run's fan on one figure, to FILE (.png, .pdf or .svg)")
    parser.add_argument("--seed", type=_non_negative_int, default=0, help="random seed of the forecasts and joint draws (default 0)")
    _add_run_metadata_args(parser)
    _add_metric_args(parser)


def _expand_patterns(patterns: Sequence[str]) -> list[str]:
    """Paths as given, with glob patterns that name no existing path expanded (sorted); a pattern matching nothing is an error.

    Sidecar metadata files (``*.meta.json``, which a shell glob such as ``runs/lr*`` also matches) are
    left out: they describe a log, and are read with it.
    """
    import glob

    paths: list[str] = []
    for pattern in patterns:
        if Path(pattern).exists() or not glob.has_magic(pattern):
            paths.append(pattern)
            continue
        matches = sorted(glob.glob(pattern))
        if not matches:
            raise BayesGrpoError(f"{pattern}: no file or folder matches this pattern")
        paths += matches
    return [path for path in paths if not path.endswith(".meta.json")]


def _read_sweep(args: argparse.Namespace) -> list[RunLog]:
    """The runs named by ``args.logs`` (cut at ``--at``, with ``--reward-range`` applied), each with a reward scale to forecast on."""
    runs = list(_load_runs(_expand_patterns(args.logs), args.encoding, **_metric(args)))
    reward_range = _reward_range(args)
    if reward_range is not None:
        runs = [run.with_meta(reward_range=reward_range) for run in runs]
    if args.at is not None:
        early = [f"{run.run_id} (first step {run.steps[0]})" for run in runs if run.steps[0] > args.at]
        if early:
            raise BayesGrpoError(f"--at {args.at} is before the first logged step of {', '.join(early)}")
        runs = [run.head(args.at) for run in runs]
    few = [run.run_id for run in runs if run.reward_range is None and len(run) < MIN_SCALE_STEPS]
    if few:
        raise BayesGrpoError(
            f"{', '.join(few)}: fewer than {MIN_SCALE_STEPS} logged steps, too few to learn a reward scale; "
            "rank once more steps are logged, or pass --reward-range LO HI"
        )
    return runs


def run(args: argparse.Namespace) -> int:
    _check_plot_file(args)
    runs = _read_sweep(args)
    if len(runs) < 2:
        raise BayesGrpoError(f"rank compares runs: {' '.join(args.logs)} holds {len(runs)}; give at least two")
    model = _load_model(args.model)
    from bayes_grpo.logs import normalise_family

    families = {normalise_family(args.family)} if args.family else {run.family for run in runs if run.family is not None}
    for family in sorted(families - set(model.families)):
        _warn(f"family {family!r} is not among the model's families ({', '.join(model.families)}); forecasting with the population level")
    with _caveats_printed():  # poor importance weights: one line from the ranking's notes below, not a warning as well
        ranking = model.rank(runs, total_steps=args.total_steps, family=args.family, params_b=args.params_b, beat=args.beat, seed=args.seed)
    print(
        f"{len(runs)} runs ranked by their final reward at step {int(ranking.total_steps[0])} (mean logged reward over the "
        f"last 10% of the steps); p_best from {ranking.finals.shape[0]} joint draws of the runs as one sweep"
        + (f", its shared effect measured on {ranking.finished_scores.size} finished run(s)" if ranking.finished_scores.size else "")
    )
    print(str(ranking))
    for note in ranking.caveats:
        _warn(_advice_wording(note))
    if args.plot:
        from matplotlib.figure import Figure

        path = Path(args.plot)
        path.parent.mkdir(parents=True, exist_ok=True)
        figure = Figure(figsize=(8, 4.5), layout="constrained")
        ranking.plot(ax=figure.add_subplot())
        figure.savefig(path, dpi=120)
        print(f"wrote the fans to {path}")
    return EXIT_OK
