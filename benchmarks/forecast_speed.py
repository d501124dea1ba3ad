"""Speed of a live forecast and of a stop query, against a full refit.

Forecasts a 1,000-step run in progress with the shipped population posterior
(no refit, no compilation) many times and reports the median wall time of the
forecast (with its diagnostics) and of the stop decision taken from it; then
times one full hierarchical refit on 12 bundled runs for the ratio. Targets:
forecast median <= 0.2 s, stop query <= 0.1 s on a 2-core machine. Timings run
one at a time in this process (a parallel engine would distort them). Writes
``benchmarks/results/forecast_speed.md``.

    python benchmarks/forecast_speed.py [--calls 30] [--model DIR]
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from common import RESULTS, markdown, provenance, verdict
from tqdm.auto import tqdm

import bayes_grpo as bg
from bayes_grpo.stopping import decision_from_forecast


def synthetic_log(n_steps: int = 1000, seed: int = 0) -> bg.RunLog:
    """A realistic noisy 3-phase reward log (slow start, rise, plateau) with outliers, half of a 2,000-step plan."""
    rng = np.random.default_rng(seed)
    t = np.arange(1, n_steps + 1) / n_steps
    curve = 0.2 + 0.6 * (1 - np.exp(-((t / 0.35) ** 2.5)))
    reward = curve + 0.08 * rng.standard_t(4, n_steps)
    frame = pd.DataFrame({"step": np.arange(1, n_steps + 1), "reward": reward})
    return bg.read_log(frame, run_id="speed", family="qwen", params_b=1.5, total_steps=2 * n_steps, reward_range=(0.0, 1.0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=30, help="timed forecasts (default 30)")
    parser.add_argument("--steps", type=int, default=1000, help="logged steps of the synthetic run (default 1000)")
    parser.add_argument("--model", help="saved model (default: the shipped one)")
    parser.add_argument("--refit-runs", type=int, default=12, help="bundled runs in the timed refit (0: skip it)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder to write the results to (default benchmarks/results)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    started_all = time.perf_counter()
    model = bg.load_model(args.model) if args.model else bg.default_model()
    run = synthetic_log(args.steps)
    decision_from_forecast(model.forecast(run))  # warm-up (imports, caches)
    forecast_s, stop_s, ess = [], [], []
    for seed in tqdm(range(args.calls), desc="forecasts", disable=args.quiet):
        started = time.perf_counter()
        fc = model.forecast(run, seed=seed)
        forecast_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        decision_from_forecast(fc)
        stop_s.append(time.perf_counter() - started)
        ess.append(float(getattr(fc, "ess", np.nan)))
    forecast_median, stop_median = float(np.median(forecast_s)), float(np.median(np.add(forecast_s, stop_s)))
    rows = [
        {"what": f"forecast of a {args.steps}-step log", "median_s": forecast_median, "p90_s": float(np.quantile(forecast_s, 0.9)), "target_s": 0.2,
         "verdict": verdict(forecast_median <= 0.2)},
        {"what": "stop query (forecast + decision)", "median_s": stop_median, "p90_s": float(np.quantile(np.add(forecast_s, stop_s), 0.9)),
         "target_s": 0.1, "verdict": verdict(stop_median <= 0.1)},
    ]  # fmt: skip
    refit = None
    if args.refit_runs:
        runs = list(bg.load_runs())[: args.refit_runs]
        started = time.perf_counter()
        fitted = bg.fit(runs, progressbar=not args.quiet)
        refit = time.perf_counter() - started
        rows.append({"what": f"full refit on {len(runs)} bundled runs ({fitted.diagnostics})", "median_s": refit, "p90_s": float("nan"),
                     "target_s": float("nan"), "verdict": f"{refit / forecast_median:.0f}x a forecast"})  # fmt: skip
    text = (
        "# Forecast and stop-query speed\n\n"
        + provenance(time.perf_counter() - started_all)
        + f"\n{args.calls} timed calls after a warm-up; importance-sampling ESS of the forecasts: median {np.nanmedian(ess):.0f}.\n\n"
        + markdown(pd.DataFrame(rows))
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "forecast_speed.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
