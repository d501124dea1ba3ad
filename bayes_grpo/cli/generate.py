"""``bayes-grpo generate``: make one bundled GRPO run with TRL.

The generator's options live in :mod:`bayes_grpo.experiments.generate`, which
imports torch, so this module imports it only when the command runs; ``main``
passes the arguments it does not know on to :func:`run` (``args.passthrough``).
"""

from __future__ import annotations

import argparse

from bayes_grpo.cli._common import PROG, _Parser

NAME = "generate"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    subparsers.add_parser("generate", add_help=False, help="make one bundled GRPO run with TRL (options: bayes-grpo generate --help)")


def run(args: argparse.Namespace) -> int:
    from bayes_grpo.experiments import generate

    parser = _Parser(prog=f"{PROG} generate", description=generate.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    generate.add_arguments(parser)
    return generate.run_generate(parser.parse_args(args.passthrough))
