"""``bayes-grpo watch``: follow a run while it trains, with a live panel of its forecast and stop decision."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from bayes_grpo.cli._common import (
    EXIT_OK,
    _add_metric_args,
    _add_run_metadata_args,
    _check_plot_file,
    _metric,
    _non_negative_float,
    _non_negative_int,
    _positive_float,
    _probability,
    _reward_range,
)
from bayes_grpo.cli._loading import _load_model
from bayes_grpo.settings import STOP_THRESHOLD, STOP_TOLERANCE

NAME = "watch"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "watch",
        help="follow a run while it trains: a live panel with its forecast and stop decision",
        description="Follow a run while it trains: a TRL output folder (the newest checkpoint's trainer_state.json, "
        "reread as checkpoints appear) or a CSV/TSV/JSONL log that grows. Each time new steps arrive it shows one "
        "panel: steps done of the plan, reward now, the forecast final reward with its 90% interval, P(plateau), the "
        "stop decision and its reason, and the GRPO signals the log has. It ends when the run reaches its planned end "
        "(or on Ctrl-C); a file caught mid-write is waited for.",
    )
    parser.add_argument("log", metavar="PATH", help="TRL output folder or log file")
    parser.add_argument("--poll", type=_positive_float, default=5.0, metavar="SECONDS", help="seconds between two looks at the log (default 5)")
    parser.add_argument("--once", action="store_true", help="print one update and exit (for scripts)")
    parser.add_argument("--plot", metavar="FILE", help="rewrite the fan chart to FILE (.png, .pdf or .svg) at every update")
    parser.add_argument("--model", metavar="FILE", help="a model file saved by 'bayes-grpo fit' (default: the shipped model)")
    parser.add_argument("--threshold", type=_probability, default=STOP_THRESHOLD, help=f"stop when P(plateau) reaches this (default {STOP_THRESHOLD})")
    parser.add_argument("--tolerance", type=_non_negative_float, default=STOP_TOLERANCE, help=f"fraction of the reward scale that counts as no gain (default {STOP_TOLERANCE})")
    parser.add_argument("--seed", type=_non_negative_int, default=0, help="random seed of the forecast draws (default 0)")
    _add_metric_args(parser)
    _add_run_metadata_args(parser)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    from bayes_grpo.watching import fan_chart, panel, save_figure, watch

    _check_plot_file(args)
    updates = watch(
        args.log, model=_load_model(args.model) if args.model else None, family=args.family, params_b=args.params_b,
        total_steps=args.total_steps, reward_range=_reward_range(args), threshold=args.threshold,
        tolerance=args.tolerance, poll=args.poll, once=args.once, seed=args.seed, encoding=args.encoding, **_metric(args),
    )  # fmt: skip
    console = Console()
    plot = Path(args.plot) if args.plot else None
    live = Live(console=console, auto_refresh=False) if console.is_terminal and not args.once else contextlib.nullcontext()
    try:
        with live:
            for update in updates:
                if plot is not None:
                    save_figure(fan_chart(update.forecast, update.decision, update.history), plot)
                shown = panel(update, poll=None if args.once else args.poll, plot=plot)
                if isinstance(live, Live):
                    live.update(shown, refresh=True)
                else:  # not a terminal (a pipe, a file): one panel per update
                    console.print(shown)
    except KeyboardInterrupt:
        print("stopped watching", file=sys.stderr)
    return EXIT_OK
