"""The ``bayes-grpo`` command line.

Each subcommand is one pair of functions, ``_add_<name>_parser(subparsers)``
and ``_run_<name>(args) -> int``, registered in :data:`COMMANDS`. To add a
command, write the pair and add one line to :data:`COMMANDS`.

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
import contextlib
import math
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import numpy as np

from bayes_grpo import __version__
from bayes_grpo.errors import BayesGrpoError
from bayes_grpo.settings import STOP_THRESHOLD, STOP_TOLERANCE

if TYPE_CHECKING:
    import pandas as pd

    from bayes_grpo.forecast import Forecast
    from bayes_grpo.logs import RunLog, RunSet
    from bayes_grpo.model import FittedModel

PROG = "bayes-grpo"
EXIT_OK, EXIT_BAD_INPUT = 0, 2
#: Exit code after a broken pipe: what a shell reports for a process killed by SIGPIPE (128 + 13).
EXIT_BROKEN_PIPE = 141
#: Below this many logged steps a forecast is mostly the population prior, and says so.
MIN_INFORMED_STEPS = 5
#: Below this many logged steps (and without --reward-range) there is no reward scale to forecast on.
MIN_SCALE_STEPS = 3
#: Python argument names in library messages -> the flags a CLI user types.
_FLAGS = {
    "total_steps": "--total-steps",
    "params_b": "--params-b",
    "reward_range": "--reward-range",
    "threshold": "--threshold",
    "tolerance": "--tolerance",
    "value_per_reward": "--value-per-reward",
    "cost_per_step": "--cost-per-step",
    "relative_to": "--relative-to",
}


def _one_line(message: object) -> str:
    return " ".join(str(message).split())


def _error(message: object) -> None:
    """Print one error line (newlines folded) to stderr."""
    print(f"{PROG}: error: {_one_line(message)}", file=sys.stderr)


def _warn(message: object) -> None:
    """Print one warning line (newlines folded) to stderr."""
    print(f"{PROG}: warning: {_one_line(message)}", file=sys.stderr)


def _cli_wording(message: str, args: argparse.Namespace) -> str:
    """Reword a library message for the command line: ``pass total_steps=`` -> ``pass --total-steps``.

    Advice to pass an argument (``name=`` with no value) always names the flag.
    ``name=value`` and a bare ``name`` become ``--flag value`` / ``--flag`` only
    where the user gave that flag; otherwise the value came from the log's own
    metadata and keeps its field name.
    """

    def reword(match: re.Match[str]) -> str:
        name, assigned, value = match.group(1), match.group(2), match.group(3)
        if getattr(args, name, None) is not None:
            return f"{_FLAGS[name]} {value}" if value else _FLAGS[name]
        return _FLAGS[name] if assigned and not value else match.group(0)

    return re.sub(rf"\b({'|'.join(_FLAGS)})\b(=(\S*))?", reword, _encoding_wording(message))


def _encoding_wording(message: str) -> str:
    """Reword the log reader's advice on text encodings for the command line.

    ``pass encoding='cp1252' (read_log/load_runs)`` -> ``pass --encoding cp1252``, and
    ``check the encoding= argument`` -> ``check --encoding``.
    """
    message = re.sub(r"""\bencoding=(['"])([^'"]+)\1(?: \(read_log/load_runs\))?""", r"--encoding \2", message)
    return message.replace("the encoding= argument", "--encoding")


@contextlib.contextmanager
def _warnings_as_lines() -> Iterator[None]:
    """Show every warning (RuntimeWarnings included) as one ``bayes-grpo: warning:`` line, each once."""

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: object = None, line: str | None = None) -> None:
        _warn(message)

    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.showwarning = show
        yield


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr (exit code 2)."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {_one_line(message)} (see '{self.prog} --help')", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def _number(text: str, kind: type) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {'a whole number' if kind is int else 'a number'}, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    """argparse type: a whole number >= 1."""
    value = int(_number(text, int))
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    """argparse type: a whole number >= 0."""
    value = int(_number(text, int))
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def _positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    value = _number(text, float)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _params_b(text: str) -> float:
    """argparse type: a model size in billions of parameters; a raw parameter count is converted with a warning.

    The bounds are :func:`bayes_grpo.logs.types.params_in_billions`'s, the ones ``read_log`` applies.
    """
    from bayes_grpo.errors import LogError
    from bayes_grpo.logs.types import params_in_billions

    value = _positive_float(text)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            billions = params_in_billions(value, text)
        except LogError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    for warning in caught:
        _warn(f"--params-b {warning.message}")
    return billions


def _non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    value = _number(text, float)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def _probability(text: str) -> float:
    """argparse type: a number strictly between 0 and 1."""
    value = _number(text, float)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (exclusive), got {text}")
    return value


def _finite_float(text: str) -> float:
    """argparse type: any finite number."""
    return _number(text, float)


def _add_encoding_arg(parser: argparse.ArgumentParser) -> None:
    """``--encoding``: the text encoding of the logs (every command that reads logs)."""
    parser.add_argument("--encoding", metavar="NAME", help="text encoding of the log files, e.g. latin-1, cp1252 or utf-16 (default: UTF-8)")


def _add_run_metadata_args(parser: argparse.ArgumentParser) -> None:
    """Options that override metadata found in a log, and its encoding (shared by commands that read one log)."""
    _add_encoding_arg(parser)
    parser.add_argument("--family", help="model family, e.g. qwen, llama, gemma, phi (unknown: the population level)")
    parser.add_argument(
        "--params-b", type=_params_b,
        help="model size in billions of parameters, e.g. 1.5 (a raw count such as 1.5e9 is converted, with a warning)",
    )  # fmt: skip
    parser.add_argument("--total-steps", type=_positive_int, help="planned number of training steps (the trainer's max_steps)")
    parser.add_argument(
        "--reward-range", type=_finite_float, nargs=2, metavar=("LO", "HI"),
        help="lowest and highest reward the reward functions can give, e.g. 0 1 (default: a scale learned from the log)",
    )  # fmt: skip


def _reward_range(args: argparse.Namespace) -> tuple[float, float] | None:
    """``--reward-range LO HI`` as a tuple (None when not given); LO must be below HI."""
    if not args.reward_range:
        return None
    lo, hi = args.reward_range
    if not lo < hi:
        raise BayesGrpoError(f"--reward-range {lo:g} {hi:g}: LO must be below HI")
    return lo, hi


def _add_metric_args(parser: argparse.ArgumentParser) -> None:
    """``--metric`` and ``--minimize``: which logged per-step number to forecast, and whether lower is better."""
    parser.add_argument(
        "--metric", default="reward", metavar="NAME",
        help="the logged per-step metric to forecast, e.g. rewards/correctness_reward_func/mean, eval_reward or kl "
        "(default: reward, the summed reward; 'inspect' lists a log's metrics); --reward-range is then in its units",
    )  # fmt: skip
    parser.add_argument("--minimize", action="store_true", help="the metric is lower-is-better (a loss): forecast it falling")


def _metric(args: argparse.Namespace) -> dict[str, str]:
    """``read_log``'s ``metric`` and ``direction`` from ``--metric`` and ``--minimize``."""
    return {"metric": args.metric, "direction": "minimize" if args.minimize else "maximize"}


def _read_run(args: argparse.Namespace) -> RunLog:
    """The run named by ``args.log``, with the metadata flags applied and ``--at`` checked against it."""
    from bayes_grpo.logs import read_log

    run = read_log(
        args.log, family=args.family, params_b=args.params_b, total_steps=args.total_steps,
        reward_range=_reward_range(args), encoding=args.encoding, **_metric(args),
    )  # fmt: skip
    at = getattr(args, "at", None)
    if at is not None:
        first, last = int(run.steps[0]), run.last_step
        if at > last:
            raise BayesGrpoError(f"--at {at} is beyond the last logged step {last} of {args.log}; give a step from {first} to {last}")
        if at < first:
            raise BayesGrpoError(f"--at {at} is before the first logged step {first} of {args.log}; give a step from {first} to {last}")
        run = run.head(at)
    if run.total_steps is None:
        raise BayesGrpoError(f"{args.log} does not say how many steps the run will take; pass --total-steps N (the trainer's max_steps)")
    if run.reward_range is not None:
        sign = -1.0 if run.direction == "minimize" else 1.0
        lo, hi = sorted(sign * v for v in run.reward_range)
        values = sign * run.rewards
        outside = (values < lo - 1e-9 * (hi - lo)) | (values > hi + 1e-9 * (hi - lo))
        if outside.any():
            what = "reward(s)" if run.metric == "reward" else f"value(s) of {run.metric}"
            raise BayesGrpoError(
                f"{args.log}: {int(outside.sum())} logged {what} lie outside the reward range {lo:g} to {hi:g} "
                f"(min {values.min():.4g}, max {values.max():.4g}); pass the range the values can reach with --reward-range"
            )
    elif len(run) < MIN_SCALE_STEPS:
        raise BayesGrpoError(
            f"{args.log}: only {len(run)} logged step(s) up to step {run.last_step}: too few to learn a reward scale; "
            f"forecast once {MIN_SCALE_STEPS} or more steps are logged, or pass --reward-range LO HI for a prior-only forecast"
        )
    return run


def _check_family(model: FittedModel, run: RunLog) -> None:
    """Warn when the run's family is not one the model was fitted on (it then gets the population level)."""
    if run.family is not None and run.family not in model.families:
        _warn(
            f"family {run.family!r} is not among the model's families ({', '.join(model.families)}); "
            "forecasting with the population level (the average over families, widened by their spread)"
        )


def _prior_only_note(run: RunLog) -> str:
    """A line flagging a forecast that rests on too few steps to be more than the population prior ('' otherwise)."""
    if len(run) >= MIN_INFORMED_STEPS:
        return ""
    return (
        f"prior-only: {len(run)} logged step(s) (fewer than {MIN_INFORMED_STEPS}) barely constrain this run; "
        "the forecast is the population prior for its family, size and reward range"
    )


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
    _add_metric_args(parser)


def _run_inspect(args: argparse.Namespace) -> int:
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


# --------------------------------------------------- fit, forecast, report, demo


def _add_sampler_args(parser: argparse.ArgumentParser) -> None:
    """Sampler settings shared by ``fit`` and ``demo``."""
    from bayes_grpo.config import PARAMETERISATIONS, ModelConfig
    from bayes_grpo.curves import CURVE_FORMS, DEFAULT_FORM

    parser.add_argument("--quick", action="store_true", help="short sampler run (200 draws, 200 tuning steps): a few minutes, rougher intervals")
    parser.add_argument("--form", default=DEFAULT_FORM, choices=CURVE_FORMS, help=f"curve form of the reward rise (default: {DEFAULT_FORM})")
    parser.add_argument("--draws", type=_positive_int, help="posterior draws per chain (default 4000, 200 with --quick)")
    parser.add_argument("--tune", type=_positive_int, help="tuning steps per chain (default 500, 200 with --quick)")
    parser.add_argument("--chains", type=_positive_int, default=2, help="number of chains (default 2)")
    parser.add_argument(
        "--parameterisation", choices=PARAMETERISATIONS, default=ModelConfig.parameterisation,
        help=f"how NUTS sees the per-run parameters (default {ModelConfig.parameterisation}: 'mixed' from 100 runs up, "
        "'non_centred' below); 'mixed' (start as an offset, the rest centred) mixes fastest on large, varied run sets "
        "(e.g. the 201 bundled + shared runs), 'non_centred' is safer on small sweeps of similar runs",
    )  # fmt: skip
    parser.add_argument("--seed", type=_non_negative_int, default=0, help="random seed of the sampler and the forecasts: one seed, one result (default 0)")


def _load_runs(paths: Sequence[str] | None, encoding: str | None = None, metric: str = "reward", direction: str = "maximize") -> RunSet:
    """Runs from files/folders (read as ``encoding``, default UTF-8), or the bundled runs when no path is given."""
    from bayes_grpo.logs import RunSet, load_runs

    target = {"metric": metric, "direction": direction}
    return RunSet(run for path in paths for run in load_runs(path, encoding=encoding, **target)) if paths else load_runs(**target)


def _fit(runs: RunSet, args: argparse.Namespace) -> FittedModel:
    from bayes_grpo.model import fit

    from bayes_grpo.config import SamplerConfig

    quick, defaults = (200 if args.quick else None), SamplerConfig()
    draws, tune = args.draws or quick or defaults.draws, args.tune or quick or defaults.tune
    print(
        f"fitting the {args.form} hierarchy to {len(runs)} runs{' (quick mode)' if args.quick else ''}: "
        f"{_fit_time_estimate(len(runs), draws + tune, args.chains)} ...",
        file=sys.stderr,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        model = fit(
            runs, model_config={"parameterisation": args.parameterisation}, form=args.form,
            draws=args.draws or quick, tune=args.tune or quick, chains=args.chains, seed=args.seed,
        )  # fmt: skip
    for w in caught:
        if issubclass(w.category, RuntimeWarning) and "converged" in str(w.message):
            _warn(w.message)
    print(f"fit: {model.diagnostics}", file=sys.stderr)
    return model


def _fit_time_estimate(n_runs: int, iterations: int, chains: int) -> str:
    """How long a fit takes, scaled from the shipped model's own fit (runs x iterations x chains)."""
    from bayes_grpo.model import default_model

    try:
        shipped = default_model()
    except BayesGrpoError:  # a shipped model from another model version: no scale to estimate from
        return "time unknown"
    work = shipped.fitted_on["n_runs"] * (shipped.sampler_config.draws + shipped.sampler_config.tune) * shipped.sampler_config.chains
    seconds = shipped.diagnostics.seconds * n_runs * iterations * chains / work
    return f"about {max(1, round(seconds / 60))} min on two CPU cores, plus a minute to compile"


def _load_model(path: str | None) -> FittedModel:
    from bayes_grpo.model import default_model, load_model

    return load_model(path) if path else default_model()


def _add_fit_parser(subparsers: argparse._SubParsersAction) -> None:
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


def _run_fit(args: argparse.Namespace) -> int:
    model = _fit(_load_runs(args.logs, args.encoding), args)
    print(f"saved the fitted model to {model.save(args.out)}")
    return EXIT_OK


def _add_forecast_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "forecast",
        help="forecast a run's reward up to its planned last step",
        description="Forecast the mean reward of one run from its logged steps up to --total-steps, with 50% and 90% "
        "credible intervals, and summarise the final reward.",
    )
    parser.add_argument("log", metavar="LOG", help="log file or TRL output folder")
    parser.add_argument("--at", type=_non_negative_int, metavar="STEP", help="forecast as if the run had only reached STEP (default: every logged step)")
    parser.add_argument("--model", metavar="FILE", help="a model file saved by 'bayes-grpo fit' (default: the model shipped with the package)")
    parser.add_argument("--rows", type=_positive_int, default=12, help="rows of the printed forecast table (default 12)")
    parser.add_argument("--plot", metavar="FILE", help="also write the fan chart to FILE (.png, .pdf or .svg)")
    parser.add_argument("--seed", type=_non_negative_int, default=0, help="random seed of the forecast draws (default 0)")
    parser.add_argument(
        "--components", action="store_true",
        help="also forecast each reward function the log holds (rewards/<fn>/mean) and say which have saturated; "
        "with --plot, their small fans side by side in FILE's -components twin",
    )  # fmt: skip
    _add_run_metadata_args(parser)
    _add_metric_args(parser)


def _run_forecast(args: argparse.Namespace) -> int:
    if args.plot and Path(args.plot).suffix.lower() not in (".png", ".pdf", ".svg"):
        raise BayesGrpoError(f"--plot {args.plot}: give a file name ending in .png, .pdf or .svg")
    if args.components and args.metric != "reward":
        raise BayesGrpoError("--components forecasts the reward functions that make up the summed reward; leave out --metric")
    run = _read_run(args)
    model = _load_model(args.model)
    _check_family(model, run)
    fc = model.forecast(run, seed=args.seed)
    frame = _in_metric_units(fc.to_frame(), run)
    ahead = frame[frame.step >= (fc.last_observed_step or 0)]
    rows = ahead.iloc[np.unique(np.linspace(0, len(ahead) - 1, max(2, args.rows)).round().astype(int))]
    note = _prior_only_note(run)
    what = "" if run.metric == "reward" else f" of {run.metric}" + (" (lower is better)" if run.direction == "minimize" else "")
    print(f"{fc.run_id}: forecast{what} from step {fc.last_observed_step} to {fc.total_steps}" + (f" ({note})" if note else ""))
    print(rows.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    final = fc.final
    lo50, hi50 = final.interval(0.5)
    lo90, hi90 = final.interval(0.9)
    median, mean = final.quantile(0.5), final.mean
    if run.direction == "minimize":
        (lo50, hi50), (lo90, hi90), median, mean = (-hi50, -lo50), (-hi90, -lo90), -median, -mean
    regimes = ", ".join(f"{name.replace('_', ' ')} {weight:.2f}" for name, weight in fc.regimes.items())
    print(f"regimes: {regimes}; draws following the run's own trend {fc.trend_weight:.2f}; importance sampling ESS {fc.ess:.0f}, Pareto k {fc.pareto_k:.2f}")
    for caveat in fc.caveats:
        print(f"note: {caveat}")
    print(
        f"final {'reward' if run.metric == 'reward' else run.metric} (mean of the last 10% of steps to {fc.total_steps}): "
        f"mean {mean:.4g}, median {median:.4g}, 50% [{lo50:.4g}, {hi50:.4g}], 90% [{lo90:.4g}, {hi90:.4g}]"
    )
    if args.plot:
        print(f"wrote the fan chart to {_save_fan_chart(fc, args)}")
    if args.components:
        _print_components(model, run, args)
    return EXIT_OK


def _in_metric_units(frame: pd.DataFrame, run: RunLog) -> pd.DataFrame:
    """A forecast table (``step, mean, q05 .. q95``) back in the metric's units: a minimised metric's negation undone."""
    if run.direction != "minimize":
        return frame
    quantiles = [c for c in frame.columns if c.startswith("q")]
    flipped = frame.assign(mean=-frame["mean"])
    flipped[quantiles] = -frame[quantiles[::-1]].to_numpy()
    return flipped


def _print_components(model: FittedModel, run: RunLog, args: argparse.Namespace) -> None:
    """Each reward function's forecast final value and 90% interval, and whether it has saturated (``--components``)."""
    from bayes_grpo.components import forecast_components, plot_components
    from bayes_grpo.logs import read_log

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a function with equal values so far: its row says so
        components = forecast_components(model, run, seed=args.seed)
    if not components:
        print("components: the log holds no per-function rewards (rewards/<fn>/mean)")
        return
    print(f"reward functions (each forecast as a run of its own, to step {components[0].forecast.total_steps}):")
    width = max(len(c.name) for c in components)
    for c in components:
        lo, hi = c.forecast.final.interval(0.9)
        now = c.forecast.observed_rewards[-max(1, len(c.forecast.observed_rewards) // 10) :].mean()
        print(
            f"  {c.name:<{width}}  now {now:.4g}, final {c.forecast.final.median:.4g} [90% {lo:.4g}, {hi:.4g}]  "
            + (f"saturated: {c.reason}" if c.saturated else "still moving")
        )
    if args.plot:
        from matplotlib.figure import Figure

        path = Path(args.plot)
        path = path.with_name(f"{path.stem}-components{path.suffix}")
        columns = min(4, len(components))
        figure = Figure(figsize=(3 * columns, 2.6 * -(-len(components) // columns)), layout="constrained")
        truth = read_log(args.log, encoding=args.encoding) if args.at is not None else None
        plot_components(components, figure, truth=truth)
        figure.savefig(path, dpi=110)
        print(f"wrote the reward functions' fans to {path}")


def _save_fan_chart(fc: Forecast, args: argparse.Namespace) -> Path:
    """Write the forecast's fan chart (with the rest of the log as the truth, when --at cut it) to ``args.plot``."""
    from matplotlib.figure import Figure

    from bayes_grpo.logs import read_log

    path = Path(args.plot)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure = Figure(figsize=(7, 4), layout="constrained")
    truth = read_log(args.log, encoding=args.encoding, **_metric(args)) if args.at is not None else None
    fc.plot(ax=figure.add_subplot(), truth=truth)
    figure.savefig(path, dpi=120)
    return path


def _add_stop_parser(subparsers: argparse._SubParsersAction) -> None:
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
    parser.add_argument("--seed", type=_non_negative_int, default=0, help="random seed of the forecast draws (default 0)")
    parser.add_argument("--json", action="store_true", help="print the decision as JSON")
    _add_run_metadata_args(parser)
    _add_metric_args(parser)


def _run_stop(args: argparse.Namespace) -> int:
    import json

    if (args.value_per_reward is None) != (args.cost_per_step is None):
        raise BayesGrpoError("the decision-theoretic mode needs both --value-per-reward and --cost-per-step")
    run = _read_run(args)
    model = _load_model(args.model)
    _check_family(model, run)
    decision = model.stop_decision(
        run, threshold=args.threshold, tolerance=args.tolerance, relative_to=args.relative_to,
        value_per_reward=args.value_per_reward, cost_per_step=args.cost_per_step, seed=args.seed,
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


def _add_rank_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "rank",
        help="rank the runs of a sweep by their forecast final reward (probability of ending best)",
        description="Forecast every run of a sweep to --total-steps and print one row per run, best first: the step "
        "it has reached, its forecast final reward (mean, q05, q50, q95) and p_best, the probability that it ends "
        "highest of the runs given (from joint draws that share the population draws).",
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


def _run_rank(args: argparse.Namespace) -> int:
    if args.plot and Path(args.plot).suffix.lower() not in (".png", ".pdf", ".svg"):
        raise BayesGrpoError(f"--plot {args.plot}: give a file name ending in .png, .pdf or .svg")
    runs = _read_sweep(args)
    if len(runs) < 2:
        raise BayesGrpoError(f"rank compares runs: {' '.join(args.logs)} holds {len(runs)}; give at least two")
    model = _load_model(args.model)
    from bayes_grpo.logs import normalise_family

    families = {normalise_family(args.family)} if args.family else {run.family for run in runs if run.family is not None}
    for family in sorted(families - set(model.families)):
        _warn(f"family {family!r} is not among the model's families ({', '.join(model.families)}); forecasting with the population level")
    ranking = model.rank(runs, total_steps=args.total_steps, family=args.family, params_b=args.params_b, beat=args.beat, seed=args.seed)
    print(
        f"{len(runs)} runs ranked by their final reward at step {int(ranking.total_steps[0])} (mean logged reward over the "
        f"last 10% of the steps); p_best from {ranking.finals.shape[0]} joint draws of the runs as one sweep"
        + (f", its shared effect measured on {ranking.finished_scores.size} finished run(s)" if ranking.finished_scores.size else "")
    )
    print(str(ranking))
    for note in ranking.caveats:
        _warn(note)
    if args.plot:
        from matplotlib.figure import Figure

        path = Path(args.plot)
        path.parent.mkdir(parents=True, exist_ok=True)
        figure = Figure(figsize=(8, 4.5), layout="constrained")
        ranking.plot(ax=figure.add_subplot())
        figure.savefig(path, dpi=120)
        print(f"wrote the fans to {path}")
    return EXIT_OK


def _add_report_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report",
        help="write a self-contained HTML report (diagnostics, checks, forecasts, stopping)",
        description="Write one HTML file (figures embedded, opens offline) with the data, sampler diagnostics, "
        "posterior predictive checks, LOO comparison, population effects, forecast fan charts, stop probabilities "
        "and, with --results, the benchmark results a folder holds.",
    )
    parser.add_argument("--model", metavar="FILE", help="a model file saved by 'bayes-grpo fit' (default: the shipped model)")
    parser.add_argument("--runs", nargs="+", metavar="PATH", help="logs or folders of logs to show (default: the bundled runs)")
    _add_encoding_arg(parser)
    parser.add_argument("--out", required=True, metavar="FILE", help="HTML file to write, e.g. report.html")
    parser.add_argument("--quick", action="store_true", help="skip the LOO comparison of curve forms")
    parser.add_argument("--compare", action="store_true", help="fit the other curve forms and compare all by LOO (slow: two more fits)")
    parser.add_argument("--shown", type=_positive_int, default=4, help="runs shown in the per-run figures (default 4)")
    parser.add_argument(
        "--results", metavar="DIR",
        help="folder of benchmark results to embed, e.g. benchmarks/results: every *.md file, with the PNG files it "
        "shows as ![..](x.png) (default: none)",
    )  # fmt: skip


#: A markdown image reference to a PNG file: ``![alt](name.png)``.
_PNG_REFERENCE = re.compile(r"!\[[^\]]*\]\(\s*([^)\s]+\.png)\s*\)", re.IGNORECASE)


def read_results(folder: str | os.PathLike) -> dict[str, list[str | bytes]]:
    """The benchmark results in ``folder`` as :func:`bayes_grpo.report.write_report` takes them.

    Each ``*.md`` file (in name order) becomes one section, titled by its file name, holding its
    text and then the bytes of each PNG file it references as ``![..](x.png)`` (relative to the
    markdown file). A referenced PNG that is missing is left out with a warning.

    Parameters
    ----------
    folder : path-like
        A folder of markdown results, such as ``benchmarks/results``.

    Returns
    -------
    dict
        File name -> ``[markdown text, png bytes, ...]``.

    Raises
    ------
    BayesGrpoError
        When ``folder`` is not a folder or holds no ``*.md`` file.

    Example
    -------
    >>> results = read_results("benchmarks/results")  # doctest: +SKIP
    >>> write_report(model, runs, "report.html", results=results)  # doctest: +SKIP
    """
    root = Path(folder)
    if not root.is_dir():
        raise BayesGrpoError(f"--results {folder}: not a folder")
    files = sorted(root.glob("*.md"))
    if not files:
        raise BayesGrpoError(f"--results {folder}: no markdown (*.md) results in this folder")
    results: dict[str, list[str | bytes]] = {}
    for md in files:
        text = md.read_text(encoding="utf-8")
        items: list[str | bytes] = [text]
        for name in dict.fromkeys(_PNG_REFERENCE.findall(text)):
            png = md.parent / name
            if png.is_file():
                items.append(png.read_bytes())
            else:
                warnings.warn(f"{md} shows {name}, which is not there; left out of the report", RuntimeWarning, stacklevel=2)
        results[md.name] = items
    return results


def _run_report(args: argparse.Namespace) -> int:
    from bayes_grpo.model import compare_forms
    from bayes_grpo.report import write_report

    results = read_results(args.results) if args.results else None
    model, runs = _load_model(args.model), _load_runs(args.runs, args.encoding)
    comparison = compare_forms(runs, progressbar=False)[0] if args.compare else None
    path = write_report(model, runs, args.out, quick=args.quick, comparison=comparison, n_shown=args.shown, results=results)
    print(f"wrote {path}")
    return EXIT_OK


def _add_demo_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="fit the bundled runs, forecast several from 30%% of their steps, decide when to stop, write the report",
        description="The whole pipeline on the runs bundled with the package: fit the hierarchy, forecast runs "
        "from the first 30%% of their steps, print the stop decisions, and write OUT/report.html (plus the "
        "fitted model in OUT/model.nc). With --quick on the bundled runs the shipped model, fitted on them at the "
        "package defaults, stands in for the fit. The same --seed prints the same table.",
    )
    parser.add_argument("--out", default="bayes_grpo_demo", metavar="DIR", help="output folder (default: bayes_grpo_demo)")
    parser.add_argument("--runs", nargs="+", metavar="PATH", help="logs or folders of logs instead of the bundled runs")
    _add_encoding_arg(parser)
    parser.add_argument("--fraction", type=_probability, default=0.3, help="part of each run's steps to forecast from, between 0 and 1 (default 0.3)")
    parser.add_argument("--shown", type=_positive_int, default=6, help="runs forecast and shown (default 6)")
    parser.add_argument("--compare", action="store_true", help="also fit the other curve forms and compare them by LOO in the report (two more fits)")
    _add_sampler_args(parser)


def _run_demo(args: argparse.Namespace) -> int:
    from bayes_grpo.model import compare_forms
    from bayes_grpo.report import pick_runs, write_report

    out = Path(args.out)
    runs = _load_runs(args.runs, args.encoding)
    from bayes_grpo.config import SamplerConfig

    shipped, defaults = _load_model(None), SamplerConfig()
    if args.quick and not (args.runs or args.draws or args.tune) and args.form == shipped.form:
        # The shipped model was fitted on the bundled runs (and the real ones) at the package defaults:
        # quick mode reuses it instead of a short fit that would not converge.
        fitted = set(shipped.fitted_on["runs"])
        print(
            f"quick mode: the shipped model, fitted on {shipped.fitted_on['n_runs']} runs ({sum(r.run_id in fitted for r in runs)} "
            f"of these {len(runs)} bundled runs among them) at the package defaults: {shipped.diagnostics}. "
            f"Forecasts and the report follow (about a minute); without --quick the demo refits the bundled runs "
            f"({_fit_time_estimate(len(runs), defaults.draws + defaults.tune, args.chains)}).",
            file=sys.stderr,
        )
        model = shipped
    else:
        model = _fit(runs, args)
    saved = model.save(out / "model.nc")
    print(_demo_table(model, pick_runs(runs, args.shown), args.fraction, seed=args.seed))
    comparison = compare_forms(runs, progressbar=False)[0] if args.compare else None
    path = write_report(model, runs, out / "report.html", quick=args.quick, comparison=comparison)
    print(f"\nwrote {path} (open it in a browser) and the fitted model {saved}")
    return EXIT_OK


def _demo_table(model: FittedModel, runs: Sequence[RunLog], fraction: float, seed: int = 0) -> str:
    """Forecasts and stop decisions from ``fraction`` of each run's steps, against what really happened.

    "compute saved" is shown only where the decision is to stop (it is what stopping would save).
    """
    import pandas as pd
    from tqdm.auto import tqdm

    from bayes_grpo.report import horizon
    from bayes_grpo.stopping import decision_from_forecast

    rows = []
    for run in tqdm(runs, desc="forecasts", leave=False):
        cut = max(int(run.steps[0]), int(round(fraction * run.last_step)))
        fc = model.forecast(run.head(cut), total_steps=horizon(run), seed=seed)
        decision = decision_from_forecast(fc, threshold=STOP_THRESHOLD, tolerance=STOP_TOLERANCE)
        lo, hi = fc.final.interval(0.9)
        tail = run.rewards[-max(1, len(run) // 10) :]
        rows.append({
            "run": run.run_id, "step": cut, "total": horizon(run), "P(plateau)": decision.probability,
            "expected gain": decision.expected_gain,
            "compute saved": f"{decision.compute_saved:.0%}" if decision.should_stop else "-",
            "decision": "stop" if decision.should_stop else "continue",
            "final forecast [90%]": f"{fc.final.median:.3g} [{lo:.3g}, {hi:.3g}]", "final actual": float(np.mean(tail)),
        })  # fmt: skip
    table = pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.3g}")
    return (
        f"stop decisions from {fraction:.0%} of each run's steps (threshold {STOP_THRESHOLD:g}, "
        f"tolerance {STOP_TOLERANCE:.0%}):\n{table}"
    )


# -------------------------------------------------------------------- watch


def _add_watch_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "watch",
        help="follow a run while it trains: a live panel with its forecast and stop decision",
        description="Follow a run while it trains: a TRL output folder (the newest checkpoint's trainer_state.json, "
        "reread as checkpoints appear) or a CSV/TSV/JSONL log that grows. Each time new steps arrive it shows one "
        "panel: steps done of the plan, reward now, the forecast final reward with its 90%% interval, P(plateau), the "
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


def _run_watch(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    from bayes_grpo.watching import fan_chart, panel, save_figure, watch

    if args.plot and Path(args.plot).suffix.lower() not in (".png", ".pdf", ".svg"):
        raise BayesGrpoError(f"--plot {args.plot}: give a file name ending in .png, .pdf or .svg")
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


# ----------------------------------------------------------------- registry

def _add_generate_parser(subparsers: argparse._SubParsersAction) -> None:
    # The generator's options live in bayes_grpo.experiments.generate, which imports
    # torch; main() passes the arguments it does not know on to _run_generate.
    subparsers.add_parser("generate", add_help=False, help="make one bundled GRPO run with TRL (options: bayes-grpo generate --help)")


def _run_generate(args: argparse.Namespace) -> int:
    from bayes_grpo.experiments import generate

    parser = _Parser(prog=f"{PROG} generate", description=generate.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    generate.add_arguments(parser)
    return generate.run_generate(parser.parse_args(args.passthrough))


COMMANDS: dict[str, tuple[Callable[[argparse._SubParsersAction], None], Callable[[argparse.Namespace], int]]] = {
    "inspect": (_add_inspect_parser, _run_inspect),
    "fit": (_add_fit_parser, _run_fit),
    "forecast": (_add_forecast_parser, _run_forecast),
    "stop": (_add_stop_parser, _run_stop),
    "rank": (_add_rank_parser, _run_rank),
    "report": (_add_report_parser, _run_report),
    "demo": (_add_demo_parser, _run_demo),
    "generate": (_add_generate_parser, _run_generate),
    "watch": (_add_watch_parser, _run_watch),
}
"""Subcommand name -> (add its parser, run it and return the exit code)."""


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand."""
    parser = _Parser(prog=PROG, description="Bayesian forecasts and a stopping rule for GRPO reward curves.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add_parser, _ in COMMANDS.values():
        add_parser(subparsers)
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
