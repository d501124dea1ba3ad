"""``bayes-grpo fit``: fit the hierarchical model to a set of runs and save it."""

from __future__ import annotations

import argparse

from bayes_grpo.cli._common import EXIT_OK, _add_encoding_arg, _add_sampler_args
from bayes_grpo.cli._loading import _fit, _load_runs

NAME = "fit"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "fit",
        help="fit the hierarchical model to reward logs and save it",
        description="Fit the hierarchical Bayesian reward-curve model (PyMC, NUTS) to a set of runs and save the "
        "posterior to FILE, which 'forecast', 'stop' and 'report' read with --model FILE.",
    )
    parser.add_argument("logs", nargs="*", metavar="LOG", help="log files or folders of logs (default: the runs bundled with the package)")
    parser.add_argument("--out", required=True, metavar="FILE", help="model file to write, e.g. my_model.nc")
    _add_encoding_arg(parser)
    _add_sampler_args(parser)


def run(args: argparse.Namespace) -> int:
    model = _fit(_load_runs(args.logs, args.encoding), args)
    print(f"saved the fitted model to {model.save(args.out)}")
    return EXIT_OK
