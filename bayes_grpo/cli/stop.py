"""``bayes-grpo stop``: the plateau stopping rule's stop/continue decision for one run."""

from __future__ import annotations

import argparse

from bayes_grpo.cli._common import (
    EXIT_OK,
    _add_metric_args,
    _add_run_metadata_args,
    _non_negative_float,
    _non_negative_int,
    _positive_float,
    _probability,
)
from bayes_grpo.cli._loading import _check_family, _load_model, _prior_only_note, _read_run
from bayes_grpo.errors import BayesGrpoError
from bayes_grpo.settings import STOP_THRESHOLD, STOP_TOLERANCE
from bayes_grpo.stopping import load_rule

NAME = "stop"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "stop",
        help="decide whether to stop a run now (plateau stopping rule)",
        description="Probability that less than TOLERANCE x the reward scale remains to gain by --total-steps, and "
        "the stop/continue decision at THRESHOLD (or, with --value-per-reward and --cost-per-step, by expected value).",
    )
    parser.add_argument("log", metavar="LOG", help="log file or TRL output folder")
    parser.add_argument("--at", type=_non_negative_int, metavar="STEP", help="decide as if the run had only reached STEP")
    parser.add_argument("--model", metavar="FILE", help="a model file saved by 'bayes-grpo fit' (default: the shipped model)")
    parser.add_argument("--threshold", type=_probability, default=STOP_THRESHOLD, help=f"stop when the probability reaches this, between 0 and 1 (default {STOP_THRESHOLD})")
    parser.add_argument("--tolerance", type=_non_negative_float, default=STOP_TOLERANCE, help=f"fraction of the reward scale that counts as no gain (default {STOP_TOLERANCE})")
    parser.add_argument("--relative-to", choices=("spread", "range", "gain"), default="spread", help="reward scale: logged 10-90%% spread (default), declared range, or gain so far")
    parser.add_argument("--value-per-reward", type=_positive_float, help="worth of one unit of reward (decision-theoretic mode)")
    parser.add_argument("--cost-per-step", type=_non_negative_float, help="cost of one training step, same currency (decision-theoretic mode)")
    parser.add_argument(
        "--rule", metavar="MODULE:CLASS",
        help="decide with this stop rule instead (a StopRule subclass made with no arguments, from an importable module or a "
        ".py file, e.g. my_rules.py:StopAtHalf or bayes_grpo.stopping:PatienceRule); the threshold, tolerance and cost flags then do not apply",
    )  # fmt: skip
    parser.add_argument("--seed", type=_non_negative_int, default=0, help="random seed of the forecast draws (default 0)")
    parser.add_argument("--json", action="store_true", help="print the decision as JSON")
    _add_run_metadata_args(parser)
    _add_metric_args(parser)


def run(args: argparse.Namespace) -> int:
    import json

    if (args.value_per_reward is None) != (args.cost_per_step is None):
        raise BayesGrpoError("the decision-theoretic mode needs both --value-per-reward and --cost-per-step")
    rule = load_rule(args.rule) if args.rule is not None else None
    run = _read_run(args)
    model = _load_model(args.model)
    _check_family(model, run)
    decision = model.stop_decision(
        run, threshold=args.threshold, tolerance=args.tolerance, relative_to=args.relative_to,
        value_per_reward=args.value_per_reward, cost_per_step=args.cost_per_step, seed=args.seed, rule=rule,
    )  # fmt: skip
    note = _prior_only_note(run)
    if args.json:
        print(json.dumps(dict(decision.to_dict(), prior_only=bool(note), metric=run.metric, direction=run.direction), indent=2))
    else:
        if run.metric != "reward":
            minus = "-" if run.direction == "minimize" else ""
            print(f"deciding on {minus}{run.metric}" + (" (negated: lower is better, so a fall is a gain)" if minus else ""))
        print(decision.explain() + (f" ({note})" if note else ""))
    return EXIT_OK
