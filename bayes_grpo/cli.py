"""The ``bayes-grpo`` command line.

Each subcommand is one pair of functions, ``_add_<name>_parser(subparsers)``
and ``_run_<name>(args) -> int``, registered in :data:`COMMANDS`. To add a
command, write the pair and add one line to :data:`COMMANDS`. Bad input
(:class:`~bayes_grpo.errors.BayesGrpoError`, a missing file) never shows a
traceback: it becomes one ``bayes-grpo: error: ...`` line on stderr and exit
code 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from bayes_grpo import __version__
from bayes_grpo.errors import BayesGrpoError

if TYPE_CHECKING:
    from bayes_grpo.logs import RunLog

PROG = "bayes-grpo"
EXIT_OK, EXIT_BAD_INPUT = 0, 2


def _error(message: str) -> None:
    """Print one error line (newlines folded) to stderr."""
    print(f"{PROG}: error: {' '.join(str(message).split())}", file=sys.stderr)


def _warn(message: str) -> None:
    print(f"{PROG}: warning: {' '.join(str(message).split())}", file=sys.stderr)


def _add_run_metadata_args(parser: argparse.ArgumentParser) -> None:
    """Options that override metadata found in a log (shared by commands that read logs)."""
    parser.add_argument("--family", help="model family, e.g. qwen, llama, gemma, phi")
    parser.add_argument("--params-b", type=float, help="model size in billions of parameters")
    parser.add_argument("--total-steps", type=int, help="planned number of training steps (max_steps)")


# ------------------------------------------------------------------ inspect


def _add_inspect_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="read reward logs and summarise each run",
        description="Read GRPO reward logs (trainer_state.json, output folder, CSV, JSONL, console log, "
        "notebook) and print a summary table per run.",
    )
    parser.add_argument("logs", nargs="+", metavar="LOG", help="log file or TRL output folder")
    _add_run_metadata_args(parser)


def _run_inspect(args: argparse.Namespace) -> int:
    from bayes_grpo.logs import read_log

    status = EXIT_OK
    for i, source in enumerate(args.logs):
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                run = read_log(source, family=args.family, params_b=args.params_b, total_steps=args.total_steps)
        except (BayesGrpoError, OSError) as exc:
            _error(exc)
            status = EXIT_BAD_INPUT
            continue
        for w in caught:
            _warn(w.message)
        if i:
            print()
        print(_summary(run))
    return status


def _summary(run: RunLog) -> str:
    """Two-column text table describing one run."""
    rewards, n = run.rewards, len(run)
    k = max(1, n // 10)
    meta = run.meta
    per_function = sorted(c.split("/", 1)[1] for c in run.table.columns if c.startswith("rewards/") and c.count("/") == 1)
    wanted = {
        "family": meta.family,
        "params_b": meta.params_b,
        "total_steps": meta.total_steps,
        "reward_std": run.reward_std,
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
        ("reward functions", ", ".join(per_function) or "-"),
        ("fields missing", ", ".join(k for k, v in wanted.items() if v is None) or "-"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


# ----------------------------------------------------------------- registry

COMMANDS: dict[str, tuple[Callable[[argparse._SubParsersAction], None], Callable[[argparse.Namespace], int]]] = {
    "inspect": (_add_inspect_parser, _run_inspect),
}
"""Subcommand name -> (add its parser, run it and return the exit code)."""


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="Bayesian forecasts and a stopping rule for GRPO reward curves."
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add_parser, _ in COMMANDS.values():
        add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 2 bad input or usage)."""
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command][1](args)
    except (BayesGrpoError, FileNotFoundError) as exc:
        _error(exc)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # output piped into `head` and closed early: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
