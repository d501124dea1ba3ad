"""The ``bayes-grpo`` command line.

Each subcommand is one module of this package with ``add_parser(subparsers)``
and ``run(args) -> int``, listed in :data:`COMMAND_MODULES`. To add a command,
write its module and add it to that tuple; what the commands share (the parser,
argument types and options, one-line errors) is in :mod:`bayes_grpo.cli._common`
and reading runs and models in :mod:`bayes_grpo.cli._loading`.

Bad input never shows a traceback. Out-of-range options (a threshold outside
(0, 1), a negative tolerance or size, ``--at`` past the end of the log) and
:class:`~bayes_grpo.errors.BayesGrpoError` / file errors become one
``bayes-grpo: error: ...`` line on stderr, worded with the command line's own
flag names, and exit code 2. Warnings become one ``bayes-grpo: warning: ...``
line each. Output piped into a reader that closes early (``| head -1``) ends
quietly with exit code 141, as a process killed by SIGPIPE would.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from bayes_grpo import __version__
from bayes_grpo.cli import demo, fit, forecast, generate, inspect, rank, report, stop, watch
from bayes_grpo.cli._common import (
    EXIT_BAD_INPUT,
    EXIT_BROKEN_PIPE,
    EXIT_OK,
    MIN_INFORMED_STEPS,
    MIN_SCALE_STEPS,
    PROG,
    _cli_wording,
    _error,
    _Parser,
    _warnings_as_lines,
)
from bayes_grpo.cli.report import read_results
from bayes_grpo.errors import BayesGrpoError

# Names the one-module CLI had, which tests and scripts import from bayes_grpo.cli.
from bayes_grpo.cli._common import _non_negative_float, _positive_float, _probability  # noqa: F401, E402
from bayes_grpo.cli.demo import _demo_table  # noqa: F401, E402

__all__ = [
    "COMMANDS",
    "COMMAND_MODULES",
    "EXIT_BAD_INPUT",
    "EXIT_BROKEN_PIPE",
    "EXIT_OK",
    "MIN_INFORMED_STEPS",
    "MIN_SCALE_STEPS",
    "PROG",
    "build_parser",
    "main",
    "read_results",
]

#: The subcommands, in the order ``bayes-grpo --help`` lists them; each module has ``NAME``, ``add_parser`` and ``run``.
COMMAND_MODULES = (inspect, fit, forecast, stop, rank, report, demo, generate, watch)

COMMANDS: dict[str, tuple[Callable[[argparse._SubParsersAction], None], Callable[[argparse.Namespace], int]]] = {
    module.NAME: (module.add_parser, module.run) for module in COMMAND_MODULES
}
"""Subcommand name -> (add its parser, run it and return the exit code)."""


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand."""
    parser = _Parser(prog=PROG, description="Bayesian forecasts and a stopping rule for GRPO reward curves.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMAND_MODULES:
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code.

    Parameters
    ----------
    argv
        The arguments after ``bayes-grpo`` (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        0 on success, 2 on bad input or usage (one error line on stderr),
        141 when stdout was closed early (a broken pipe).

    Example
    -------
    >>> main(["--version"])  # doctest: +SKIP
    bayes-grpo 0.1.0
    """
    parser = build_parser()
    args, passthrough = parser.parse_known_args(argv)
    if passthrough and args.command != "generate":
        parser.error(f"unrecognized arguments: {' '.join(passthrough)}")
    args.passthrough = passthrough
    with _warnings_as_lines():
        try:
            code = COMMANDS[args.command][1](args)
            sys.stdout.flush()  # a closed pipe shows up here, inside the handler, not at interpreter exit
            return code
        except BrokenPipeError:  # output piped into `head` and closed early: quiet, like a SIGPIPE exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_BROKEN_PIPE
        except BayesGrpoError as exc:
            _error(_cli_wording(str(exc), args))
            return EXIT_BAD_INPUT
        except OSError as exc:  # a missing or unreadable file
            _error(exc)
            return EXIT_BAD_INPUT
