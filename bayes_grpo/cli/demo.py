"""``bayes-grpo demo``: the whole pipeline on the bundled runs (fit, forecasts, stop decisions, report)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bayes_grpo.cli._common import EXIT_OK, _add_encoding_arg, _add_sampler_args, _positive_int, _probability, _progress_bars
from bayes_grpo.cli._loading import _fit, _fit_time_estimate, _load_model, _load_runs
from bayes_grpo.settings import STOP_THRESHOLD, STOP_TOLERANCE

if TYPE_CHECKING:
    from bayes_grpo.logs import RunLog
    from bayes_grpo.model import FittedModel

NAME = "demo"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="fit the bundled runs, forecast several from 30%% of their steps, decide when to stop, write the report",
        description="The whole pipeline on the runs bundled with the package: fit the hierarchy, forecast runs "
        "from the first 30% of their steps, print the stop decisions, and write OUT/report.html (plus the "
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


def run(args: argparse.Namespace) -> int:
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
        among = sum(r.run_id in fitted for r in runs)
        print(
            f"quick mode: the shipped model, fitted on {shipped.fitted_on['n_runs']} runs "
            f"({f'all {len(runs)}' if among == len(runs) else f'{among} of the {len(runs)}'} bundled runs among them) "
            f"at the package defaults: {shipped.diagnostics}. "
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
    path = write_report(model, runs, out / "report.html", quick=args.quick, comparison=comparison, progress=_progress_bars())
    print(f"\nwrote {path} (open it in a browser) and the fitted model {saved}")
    return EXIT_OK


def _demo_table(model: FittedModel, runs: Sequence[RunLog], fraction: float, seed: int = 0) -> str:
    """Forecasts and stop decisions from ``fraction`` of each run's steps, and what the rule's stop was worth in hindsight.

    "decision" is the stop rule's call at ``fraction`` of the steps. The rule is then checked every
    :data:`CHECK_EVERY` of the plan until it stops: "stops at" is that step ("-": it never stops
    before the end), "compute saved" the share of the planned steps not trained ("0%": none).
    The bundled runs' futures are known, so "hindsight" judges the stop with the stopping
    backtest's regret: how far the run's smoothed reward (:func:`bayes_grpo.measures.smoothed`)
    still rose after the stop, over its 10-90% spread; at most :data:`BAD_STOP_REGRET` is a right stop.
    """
    import pandas as pd
    from tqdm.auto import tqdm

    from bayes_grpo.measures import final_reward, horizon
    from bayes_grpo.stopping import decision_from_forecast

    rows = []
    for run in tqdm(runs, desc="forecasts", leave=False, disable=not _progress_bars()):
        total = horizon(run)
        checks = _check_steps(run, fraction)
        decisions = []
        for step in checks:
            fc = model.forecast(run.head(step), total_steps=total, seed=seed)
            decisions.append((step, fc, decision_from_forecast(fc, threshold=STOP_THRESHOLD, tolerance=STOP_TOLERANCE)))
            if decisions[-1][2].should_stop:
                break
        cut, fc, decision = decisions[0]
        stop = decisions[-1][0] if decisions[-1][2].should_stop else None
        lo, hi = fc.final.interval(0.9)
        rows.append({
            "run": run.run_id, "step": cut, "total": total, "P(plateau)": decision.probability,
            "expected gain": decision.expected_gain, "decision": "stop" if decision.should_stop else "continue",
            "final forecast [90%]": f"{fc.final.median:.3g} [{lo:.3g}, {hi:.3g}]", "final actual": final_reward(run.rewards),
            "stops at": "-" if stop is None else str(stop),
            "compute saved": "0%" if stop is None else f"{max(total - stop, 0) / total:.0%}",
            "hindsight": "no stop" if stop is None else _hindsight(run, stop),
        })  # fmt: skip
    table = pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.3g}")
    return (
        f"stop decisions from {fraction:.0%} of each run's steps (threshold {STOP_THRESHOLD:g}, "
        f"tolerance {STOP_TOLERANCE:.0%}), then every {CHECK_EVERY:.0%} of its steps until the rule stops:\n{table}\n"
        "compute saved: share of the planned steps not trained when the rule stops;\n"
        f"hindsight: the stop was right when the run's smoothed reward rose by at most {BAD_STOP_REGRET:g} of its 10-90% spread after it (the stopping backtest's regret)"
    )


#: After the first check, the demo checks each run again every this share of its logged steps.
CHECK_EVERY = 0.1
#: The regret (rise after the stop / 10-90% spread) above which the stopping backtest counts a stop as bad.
BAD_STOP_REGRET = 0.05


def _check_steps(run: RunLog, fraction: float) -> list[int]:
    """The logged steps the demo checks: at ``fraction`` of the run's steps, then every :data:`CHECK_EVERY` before its end."""
    first = int(run.steps[0])
    steps = [max(first, int(round(f * run.last_step))) for f in np.arange(fraction, 1.0 - 1e-9, CHECK_EVERY)]
    return list(dict.fromkeys(step for step in steps if step < run.last_step or step == steps[0]))


def _hindsight(run: RunLog, stop: int) -> str:
    """"right" or "too early", with the regret of stopping ``run`` at ``stop`` (the stopping backtest's measure)."""
    from bayes_grpo.measures import reward_spread, smoothed

    steps = run.steps.astype(float)
    curve = smoothed(steps, run.rewards)
    regret = (float(curve[-1]) - float(np.interp(stop, steps, curve))) / reward_spread(run.rewards)
    return f"{'right' if regret <= BAD_STOP_REGRET else 'too early'} (regret {regret:.2f})"
