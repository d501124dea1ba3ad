"""Reading what a command works on: one run (with the command line's metadata), a set of runs, a model, a fit."""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

from bayes_grpo.cli._common import MIN_INFORMED_STEPS, MIN_SCALE_STEPS, _metric, _progress_bars, _reward_range, _warn
from bayes_grpo.errors import BayesGrpoError
from bayes_grpo.logs.plan import planned_length

if TYPE_CHECKING:
    from bayes_grpo.logs import RunLog, RunSet
    from bayes_grpo.model import FittedModel


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
    planned_length(run.total_steps, run.last_step, str(args.log))
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
            progressbar=_progress_bars(),  # no bar in a log file: PyMC's redraws garble it
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
