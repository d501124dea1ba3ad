"""Speed of ranking a sweep: ``model.rank`` on 20 runs of 1,000 logged steps, and where the time goes.

The sweep is 20 synthetic noisy reward logs of one recipe with different settings (a slow start, a
rise of different size and timing, a plateau; Student-t noise), each logged every step up to step
1,000 of a 2,000-step plan, on a learned reward scale: every run is in progress, so every run is
forecast. The median wall time and CPU time of ``model.rank`` over several calls are reported, with
the time of the 20 forecasts alone, made as rank makes them (the rest is the joint draws). Target: <= 1 s.
Run it on an otherwise idle machine. On a loaded one, the reference figure puts the times in
scale: the median time, taken alongside, of one forecast of ``benchmarks/forecast_speed.py``'s
1,000-step log (its idle figure is in ``benchmarks/results/forecast_speed.md``).
Prints the figures; ``benchmarks/backtest_sweeps.py`` puts them in its results.

    python benchmarks/rank_speed.py [--calls 5] [--runs 20] [--steps 1000]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import pandas as pd

import bayes_grpo as bg
from bayes_grpo.sweeps import RANK_FORECAST_DRAWS, RANK_GRID_POINTS, RANK_PARTICLES
from forecast_speed import synthetic_log


def synthetic_sweep(n_runs: int = 20, n_steps: int = 1000, seed: int = 0) -> list[bg.RunLog]:
    """``n_runs`` noisy reward logs of ``n_steps`` steps, half of a ``2 * n_steps`` plan, with different rises."""
    rng = np.random.default_rng(seed)
    steps = np.arange(1, n_steps + 1)
    t = steps / (2 * n_steps)
    runs = []
    for i in range(n_runs):
        gain, tau, shape = rng.uniform(0.2, 1.2), rng.uniform(0.1, 0.6), rng.uniform(1.5, 4.0)
        curve = 0.1 + gain / (1.0 + (tau / t) ** shape)
        reward = curve + 0.08 * rng.standard_t(4, n_steps)
        frame = pd.DataFrame({"step": steps, "reward": reward})
        runs.append(bg.read_log(frame, run_id=f"run-{i:02d}", family="qwen", params_b=1.5, total_steps=2 * n_steps))
    return runs


def measure(model: bg.FittedModel, runs: list[bg.RunLog], calls: int) -> dict[str, float]:
    """Median wall and CPU seconds of ``model.rank(runs)``, and of the forecasts it makes, over ``calls`` calls."""
    model.rank(runs, seed=0)  # warm-up (imports, cached population arrays)
    reference_run = synthetic_log()
    wall, cpu, forecasts, reference = [], [], [], []
    for seed in range(1, calls + 1):
        started, started_cpu = time.perf_counter(), time.process_time()
        model.rank(runs, seed=seed)
        wall.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
        started = time.perf_counter()
        for run in runs:
            model.forecast(run, n_draws=RANK_FORECAST_DRAWS, n_particles=RANK_PARTICLES, grid_points=RANK_GRID_POINTS, seed=seed)
        forecasts.append(time.perf_counter() - started)
        started = time.perf_counter()
        model.forecast(reference_run, seed=seed)
        reference.append(time.perf_counter() - started)
    return {
        "runs": len(runs),
        "logged_steps": int(runs[0].last_step),
        "rank_wall_s": float(np.median(wall)),
        "rank_cpu_s": float(np.median(cpu)),
        "forecasts_wall_s": float(np.median(forecasts)),
        "per_forecast_s": float(np.median(forecasts)) / len(runs),
        "reference_forecast_s": float(np.median(reference)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=5, help="timed calls of model.rank (default 5)")
    parser.add_argument("--runs", type=int, default=20, help="runs in the sweep (default 20)")
    parser.add_argument("--steps", type=int, default=1000, help="logged steps per run (default 1000)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    figures = measure(bg.default_model(), synthetic_sweep(args.runs, args.steps), args.calls)
    print(
        f"rank {figures['runs']} runs of {figures['logged_steps']} logged steps: median {figures['rank_wall_s']:.2f} s wall, "
        f"{figures['rank_cpu_s']:.2f} s CPU (target <= 1 s: {'met' if figures['rank_wall_s'] <= 1.0 else 'missed'}); "
        f"the {figures['runs']} forecasts alone {figures['forecasts_wall_s']:.2f} s ({figures['per_forecast_s']:.3f} s each); "
        f"reference: one forecast of forecast_speed.py's log {figures['reference_forecast_s']:.3f} s"
    )


if __name__ == "__main__":
    main()
