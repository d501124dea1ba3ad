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
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bayes_grpo import __version__
from bayes_grpo.errors import BayesGrpoError

if TYPE_CHECKING:
    from bayes_grpo.logs import RunLog, RunSet
    from bayes_grpo.model import FittedModel

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


# --------------------------------------------------- fit, forecast, report, demo


def _add_sampler_args(parser: argparse.ArgumentParser) -> None:
    """Sampler settings shared by ``fit`` and ``demo``."""
    from bayes_grpo.curves import CURVE_FORMS, DEFAULT_FORM

    parser.add_argument("--quick", action="store_true", help="short sampler run (200 draws, 200 tuning steps): a few minutes, rougher intervals")
    parser.add_argument("--form", default=DEFAULT_FORM, choices=CURVE_FORMS, help=f"curve form of the reward rise (default: {DEFAULT_FORM})")
    parser.add_argument("--draws", type=int, help="posterior draws per chain (default 1000, 200 with --quick)")
    parser.add_argument("--tune", type=int, help="tuning steps per chain (default 1000, 200 with --quick)")
    parser.add_argument("--chains", type=int, default=2, help="number of chains (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")


def _load_runs(paths: Sequence[str] | None) -> RunSet:
    """Runs from files/folders, or the bundled runs when no path is given."""
    from bayes_grpo.logs import RunSet, load_runs

    return RunSet(run for path in paths for run in load_runs(path)) if paths else load_runs()


def _fit(runs: RunSet, args: argparse.Namespace) -> FittedModel:
    from bayes_grpo.model import fit

    quick = 200 if args.quick else None
    print(f"fitting the {args.form} hierarchy to {len(runs)} runs{' (quick mode)' if args.quick else ''} ...", file=sys.stderr)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        model = fit(runs, form=args.form, draws=args.draws or quick, tune=args.tune or quick, chains=args.chains, seed=args.seed)
    for w in caught:
        if issubclass(w.category, RuntimeWarning) and "converged" in str(w.message):
            _warn(w.message)
    print(f"fit: {model.diagnostics}", file=sys.stderr)
    return model


def _load_model(folder: str | None) -> FittedModel:
    from bayes_grpo.model import default_model, load_model

    return load_model(folder) if folder else default_model()


def _add_fit_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "fit",
        help="fit the hierarchical model to reward logs and save it",
        description="Fit the hierarchical Bayesian reward-curve model (PyMC, NUTS) to a set of runs and save the "
        "posterior to DIR, which 'forecast', 'stop' and 'report' read with --model DIR.",
    )
    parser.add_argument("logs", nargs="*", metavar="LOG", help="log files or folders of logs (default: the runs bundled in data/runs)")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder to save the fitted model in (created if missing)")
    _add_sampler_args(parser)


def _run_fit(args: argparse.Namespace) -> int:
    model = _fit(_load_runs(args.logs), args)
    print(f"saved the fitted model to {model.save(args.out)}")
    return EXIT_OK


def _add_forecast_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "forecast",
        help="forecast a run's reward up to its planned last step",
        description="Forecast the mean reward of one run from its logged steps up to total_steps, with 50% and 90% "
        "credible intervals, and summarise the final reward.",
    )
    parser.add_argument("log", metavar="LOG", help="log file or TRL output folder")
    parser.add_argument("--at", type=int, metavar="STEP", help="forecast as if the run had only reached STEP (default: every logged step)")
    parser.add_argument("--model", metavar="DIR", help="a model saved by 'bayes-grpo fit' (default: the model shipped with the package)")
    parser.add_argument("--rows", type=int, default=12, help="rows of the printed forecast table (default 12)")
    _add_run_metadata_args(parser)


def _run_forecast(args: argparse.Namespace) -> int:
    from bayes_grpo.logs import read_log

    run = read_log(args.log, family=args.family, params_b=args.params_b, total_steps=args.total_steps)
    if args.at is not None:
        run = run.head(args.at)
    fc = _load_model(args.model).forecast(run, total_steps=args.total_steps)
    frame = fc.to_frame()
    ahead = frame[frame.step >= (fc.last_observed_step or 0)]
    rows = ahead.iloc[np.unique(np.linspace(0, len(ahead) - 1, max(2, args.rows)).round().astype(int))]
    print(f"{fc.run_id}: forecast from step {fc.last_observed_step} to {fc.total_steps}")
    print(rows.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    final = fc.final
    lo50, hi50 = final.interval(0.5)
    lo90, hi90 = final.interval(0.9)
    print(
        f"final reward at step {fc.total_steps}: mean {final.mean:.4g}, median {final.quantile(0.5):.4g}, "
        f"50% [{lo50:.4g}, {hi50:.4g}], 90% [{lo90:.4g}, {hi90:.4g}]"
    )
    return EXIT_OK


def _add_stop_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "stop",
        help="decide whether to stop a run now (plateau stopping rule)",
        description="Probability that less than TOLERANCE x the reward scale remains to gain by total_steps, and "
        "the stop/continue decision at THRESHOLD (or, with --value-per-reward and --cost-per-step, by expected value).",
    )
    parser.add_argument("log", metavar="LOG", help="log file or TRL output folder")
    parser.add_argument("--at", type=int, metavar="STEP", help="decide as if the run had only reached STEP")
    parser.add_argument("--model", metavar="DIR", help="a model saved by 'bayes-grpo fit' (default: the shipped model)")
    parser.add_argument("--threshold", type=float, default=0.9, help="stop when the probability reaches this (default 0.9)")
    parser.add_argument("--tolerance", type=float, default=0.01, help="fraction of the reward scale that counts as no gain (default 0.01)")
    parser.add_argument("--relative-to", choices=("range", "gain"), default="range", help="reward scale: range/spread (default) or gain so far")
    parser.add_argument("--value-per-reward", type=float, help="worth of one unit of reward (decision-theoretic mode)")
    parser.add_argument("--cost-per-step", type=float, help="cost of one training step, same currency (decision-theoretic mode)")
    parser.add_argument("--json", action="store_true", help="print the decision as JSON")
    _add_run_metadata_args(parser)


def _run_stop(args: argparse.Namespace) -> int:
    import json

    from bayes_grpo.logs import read_log

    run = read_log(args.log, family=args.family, params_b=args.params_b, total_steps=args.total_steps)
    if args.at is not None:
        run = run.head(args.at)
    decision = _load_model(args.model).stop_decision(
        run, total_steps=args.total_steps, threshold=args.threshold, tolerance=args.tolerance,
        relative_to=args.relative_to, value_per_reward=args.value_per_reward, cost_per_step=args.cost_per_step,
    )
    print(json.dumps(decision.to_dict(), indent=2) if args.json else decision.explain())
    return EXIT_OK


def _add_report_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report",
        help="write a self-contained HTML report (diagnostics, checks, forecasts, stopping)",
        description="Write one HTML file (figures embedded, opens offline) with the data, sampler diagnostics, "
        "posterior predictive checks, LOO comparison, population effects, forecast fan charts, stop probabilities "
        "and the benchmark tables.",
    )
    parser.add_argument("--model", metavar="DIR", help="a model saved by 'bayes-grpo fit' (default: the shipped model)")
    parser.add_argument("--runs", nargs="+", metavar="PATH", help="logs or folders of logs to show (default: the bundled runs)")
    parser.add_argument("--out", required=True, metavar="FILE", help="HTML file to write, e.g. report.html")
    parser.add_argument("--quick", action="store_true", help="skip the LOO comparison of curve forms")
    parser.add_argument("--compare", action="store_true", help="fit the other curve forms and compare all by LOO (slow: two more fits)")
    parser.add_argument("--shown", type=int, default=4, help="runs shown in the per-run figures (default 4)")


def _run_report(args: argparse.Namespace) -> int:
    from bayes_grpo.report import compare_table, write_report

    model, runs = _load_model(args.model), _load_runs(args.runs)
    comparison = compare_table(model, runs) if args.compare and model.idata is not None else None
    print(f"wrote {write_report(model, runs, args.out, quick=args.quick, comparison=comparison, n_shown=args.shown)}")
    return EXIT_OK


def _add_demo_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="fit the bundled runs, forecast several from 30%% of their steps, decide when to stop, write the report",
        description="The whole pipeline on the runs bundled with the repository: fit the hierarchy, forecast runs "
        "from the first 30% of their steps, print the stop decisions, and write OUT/report.html (plus the "
        "fitted model in OUT/model).",
    )
    parser.add_argument("--out", default="bayes_grpo_demo", metavar="DIR", help="output folder (default: bayes_grpo_demo)")
    parser.add_argument("--runs", nargs="+", metavar="PATH", help="logs or folders of logs instead of the bundled runs")
    parser.add_argument("--fraction", type=float, default=0.3, help="part of each run's steps to forecast from (default 0.3)")
    parser.add_argument("--shown", type=int, default=6, help="runs forecast and shown (default 6)")
    parser.add_argument("--compare", action="store_true", help="also fit the other curve forms and compare them by LOO in the report (two more fits)")
    _add_sampler_args(parser)


def _run_demo(args: argparse.Namespace) -> int:
    from bayes_grpo.report import compare_table, pick_runs, write_report

    out = Path(args.out)
    runs = _load_runs(args.runs)
    model = _fit(runs, args)
    model.save(out / "model")
    print(_demo_table(model, pick_runs(runs, args.shown), args.fraction))
    comparison = compare_table(model, runs) if args.compare else None
    path = write_report(model, runs, out / "report.html", quick=args.quick, comparison=comparison)
    print(f"\nwrote {path} (open it in a browser) and the fitted model in {out / 'model'}")
    return EXIT_OK


def _demo_table(model: FittedModel, runs: Sequence[RunLog], fraction: float) -> str:
    """Forecasts and stop decisions from ``fraction`` of each run's steps, against what really happened."""
    import pandas as pd
    from tqdm.auto import tqdm

    from bayes_grpo.report import horizon
    from bayes_grpo.stopping import decision_from_forecast

    rows = []
    for run in tqdm(runs, desc="forecasts", leave=False):
        cut = max(int(run.steps[0]), int(round(fraction * run.last_step)))
        fc = model.forecast(run.head(cut), total_steps=horizon(run))
        decision = decision_from_forecast(fc)
        lo, hi = fc.final.interval(0.9)
        tail = run.rewards[-max(1, len(run) // 10) :]
        rows.append({
            "run": run.run_id, "step": cut, "total": horizon(run), "P(plateau)": decision.probability,
            "expected gain": decision.expected_gain, "compute saved": f"{decision.compute_saved:.0%}",
            "decision": "stop" if decision.should_stop else "continue",
            "final forecast [90%]": f"{fc.final.mean:.3g} [{lo:.3g}, {hi:.3g}]", "final actual": float(np.mean(tail)),
        })  # fmt: skip
    table = pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.3g}")
    return f"stop decisions from {fraction:.0%} of each run's steps (threshold 0.9, tolerance 1%):\n{table}"


# ----------------------------------------------------------------- registry

def _add_generate_parser(subparsers: argparse._SubParsersAction) -> None:
    # The generator's options live in bayes_grpo.experiments.generate, which imports
    # torch; main() passes the arguments it does not know on to _run_generate.
    subparsers.add_parser("generate", add_help=False, help="make one bundled GRPO run with TRL (options: bayes-grpo generate --help)")


def _run_generate(args: argparse.Namespace) -> int:
    from bayes_grpo.experiments import generate

    parser = argparse.ArgumentParser(
        prog=f"{PROG} generate", description=generate.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    generate.add_arguments(parser)
    return generate.run_generate(parser.parse_args(args.passthrough))


COMMANDS: dict[str, tuple[Callable[[argparse._SubParsersAction], None], Callable[[argparse.Namespace], int]]] = {
    "inspect": (_add_inspect_parser, _run_inspect),
    "fit": (_add_fit_parser, _run_fit),
    "forecast": (_add_forecast_parser, _run_forecast),
    "stop": (_add_stop_parser, _run_stop),
    "report": (_add_report_parser, _run_report),
    "demo": (_add_demo_parser, _run_demo),
    "generate": (_add_generate_parser, _run_generate),
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
    parser = build_parser()
    args, passthrough = parser.parse_known_args(argv)
    if passthrough and args.command != "generate":
        parser.error(f"unrecognized arguments: {' '.join(passthrough)}")
    args.passthrough = passthrough
    try:
        return COMMANDS[args.command][1](args)
    except (BayesGrpoError, FileNotFoundError) as exc:
        _error(exc)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # output piped into `head` and closed early: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
