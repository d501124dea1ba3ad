"""``bayes-grpo forecast``: forecast one run's reward to its planned last step (table, final reward, fan chart)."""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bayes_grpo.cli._common import (
    EXIT_OK,
    _add_metric_args,
    _advice_wording,
    _add_run_metadata_args,
    _caveats_printed,
    _check_plot_file,
    _metric,
    _non_negative_int,
    _positive_int,
)
from bayes_grpo.cli._loading import _check_family, _load_model, _prior_only_note, _read_run
from bayes_grpo.errors import BayesGrpoError

if TYPE_CHECKING:
    import pandas as pd

    from bayes_grpo.forecast import Forecast
    from bayes_grpo.logs import RunLog
    from bayes_grpo.model import FittedModel

NAME = "forecast"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
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


def run(args: argparse.Namespace) -> int:
    _check_plot_file(args)
    if args.components and args.metric != "reward":
        raise BayesGrpoError("--components forecasts the reward functions that make up the summed reward; leave out --metric")
    run = _read_run(args)
    model = _load_model(args.model)
    _check_family(model, run)
    with _caveats_printed():  # poor importance weights: one note below, not a warning as well
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
        print(f"note: {_advice_wording(caveat)}")
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
    forecast = [c for c in components if not c.constant]
    end = f", to step {forecast[0].forecast.total_steps}" if forecast else ""
    print(f"reward functions (each forecast as a run of its own{end}):")
    width = max(len(c.name) for c in components)
    for c in components:
        if c.forecast is None:  # one value at every step: nothing to forecast
            print(f"  {c.name:<{width}}  {c.status}")
            continue
        lo, hi = c.forecast.final.interval(0.9)
        now = c.forecast.observed_rewards[-max(1, len(c.forecast.observed_rewards) // 10) :].mean()
        print(f"  {c.name:<{width}}  now {now:.4g}, final {c.forecast.final.median:.4g} [90% {lo:.4g}, {hi:.4g}]  {c.status}")
    if args.plot and forecast:
        from matplotlib.figure import Figure

        path = Path(args.plot)
        path = path.with_name(f"{path.stem}-components{path.suffix}")
        columns = min(4, len(forecast))
        figure = Figure(figsize=(3 * columns, 2.6 * -(-len(forecast) // columns)), layout="constrained")
        truth = read_log(args.log, encoding=args.encoding) if args.at is not None else None
        plot_components(components, figure, truth=truth)
        figure.savefig(path, dpi=110)
        print(f"wrote the reward functions' fans to {path}")


def _save_fan_chart(fc: Forecast, args: argparse.Namespace) -> Path:
    """Write the forecast's fan chart (with the rest of the log as the truth, when --at cut it) to ``args.plot``."""
    from matplotlib.figure import Figure

    from bayes_grpo.logs import read_log

    from bayes_grpo.plotting import save_figure

    figure = Figure(figsize=(7, 4), layout="constrained")
    truth = read_log(args.log, encoding=args.encoding, **_metric(args)) if args.at is not None else None
    fc.plot(ax=figure.add_subplot(), truth=truth)
    return save_figure(figure, args.plot)
