"""``bayes-grpo inspect``: read reward logs and print a summary table per run, with the metrics each logs."""

from __future__ import annotations

import argparse
import warnings
from typing import TYPE_CHECKING

import numpy as np

from bayes_grpo.cli._common import (
    EXIT_BAD_INPUT,
    EXIT_OK,
    _add_metric_args,
    _add_run_metadata_args,
    _cli_wording,
    _error,
    _metric,
    _reward_range,
    _warn,
)
from bayes_grpo.errors import BayesGrpoError

if TYPE_CHECKING:
    from bayes_grpo.logs import RunLog

NAME = "inspect"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="read reward logs and summarise each run",
        description="Read GRPO reward logs (trainer_state.json, output folder, CSV, JSONL, console log, "
        "notebook) and print a summary table per run.",
    )
    parser.add_argument("logs", nargs="+", metavar="LOG", help="log file or TRL output folder")
    _add_run_metadata_args(parser)
    _add_metric_args(parser)


def run(args: argparse.Namespace) -> int:
    from bayes_grpo.logs import read_log

    status = EXIT_OK
    for i, source in enumerate(args.logs):
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                run = read_log(
                    source, family=args.family, params_b=args.params_b, total_steps=args.total_steps,
                    reward_range=_reward_range(args), encoding=args.encoding, **_metric(args),
                )  # fmt: skip
        except (BayesGrpoError, OSError) as exc:
            _error(_cli_wording(str(exc), args))
            status = EXIT_BAD_INPUT
            continue
        for w in caught:
            _warn(w.message)
        if i:
            print()
        print(_summary(run))
    return status


def _summary(run: RunLog) -> str:
    """Two-column text table describing one run, then its metrics with how often each is logged."""
    from bayes_grpo.logs import GRPO_SIGNALS

    sign = -1.0 if run.direction == "minimize" else 1.0
    rewards, n = sign * run.rewards, len(run)
    k = max(1, n // 10)
    meta = run.meta
    per_function = [s[len("rewards/") : -len("/mean")] for s in run.signals if s.startswith("rewards/") and s.endswith("/mean")]
    with_std = [f for f in per_function if f"rewards/{f}/std" in run.signals]
    stds = "means and stds" if len(with_std) == len(per_function) else f"means; stds of {len(with_std)}" if with_std else "means"
    functions = ", ".join(per_function) + (f" ({stds})" if per_function else "")
    grpo = [name for name in GRPO_SIGNALS if name in run.signals]
    wanted = {
        "family": meta.family,
        "params_b": meta.params_b,
        "total_steps": meta.total_steps,
        "reward_range": meta.reward_range,
        "initial_reward": meta.initial_reward,
    }
    rows = [
        ("run", run.run_id),
        ("source", meta.source or "-"),
        ("family", meta.family or "-"),
        ("params_b", "-" if meta.params_b is None else f"{meta.params_b:g}"),
        ("total_steps", "-" if meta.total_steps is None else str(meta.total_steps)),
        ("steps logged", str(n)),
        ("first / last step", f"{run.steps[0]} / {run.last_step}"),
        (f"reward start (first {k})", f"{rewards[:k].mean():.4g}"),
        (f"reward end (last {k})", f"{rewards[-k:].mean():.4g}"),
        ("reward min .. max", f"{rewards.min():.4g} .. {rewards.max():.4g}"),
        ("reward functions", functions or "-"),
        ("GRPO signals", ", ".join(grpo) or "-"),
        ("GRPO signals missing", ", ".join(name for name in GRPO_SIGNALS if name not in grpo) or "-"),
        ("fields missing", ", ".join(k for k, v in wanted.items() if v is None) or "-"),
    ]
    bounds = _bounds_read_from_log(run)
    if bounds:
        rows.insert(rows.index(("reward functions", functions or "-")), ("reward bounds", bounds))
    if run.metric != "reward":
        label = run.metric + (" (lower is better)" if run.direction == "minimize" else "")
        rows.insert(1, ("metric", label))
        rows = [(name.replace("reward start", "start").replace("reward end", "end").replace("reward min", "min"), value) for name, value in rows]
    width = max(len(name) for name, _ in rows)
    table = "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
    metrics = [(name, _logging_frequency(run.steps, run.signal(name))) for name in run.signals]
    shown = [(run.metric if name == "reward" and run.metric != "reward" else name, how) for name, how in metrics]
    shown = list(dict.fromkeys(shown))
    width = max(len(name) for name, _ in shown)
    listing = "\n".join(f"  {name:<{width}}  {how}" for name, how in shown)
    return f"{table}\nmetrics (forecast one with --metric NAME):\n{listing}"


def _bounds_read_from_log(run: RunLog) -> str:
    """The reward's range a forecast reads off a log without a declared one (:attr:`bayes_grpo.prepare.PreparedRun.bounds`,
    as :func:`bayes_grpo.prepare.prepare_run` reads it), with what showed it; "" when there is none."""
    from bayes_grpo.prepare import prepare_run

    prepared = prepare_run(run, require_total=False)
    if prepared.kind != "learned" or prepared.reward_ceiling is None:
        return ""
    low, high = prepared.bounds
    return f"{low:.4g} .. {high:.4g}, read from the log ({prepared.ceiling_evidence}): forecasts stay within it"


def _logging_frequency(steps: np.ndarray, values: np.ndarray) -> str:
    """How often a metric was logged: 'every step, 300 values', 'every 50 steps, 10 values', 'every ~7 steps, ...'."""
    logged = steps[np.isfinite(values)]
    count = f"{logged.size} value{'s' if logged.size != 1 else ''}"
    if logged.size < 2:
        return count
    gaps = np.diff(logged)
    gap = int(np.median(gaps))
    every = "every step" if gap == 1 else f"every {gap} steps"
    return f"{every if np.all(gaps == gap) else every.replace('every ', 'every ~')}, {count}"
