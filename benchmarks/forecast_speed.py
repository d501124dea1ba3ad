"""Speed of live conditioning vs a full refit.

Forecasts a 1,000-step run in progress from the shipped population posterior
(no recompiling, no refit) many times and reports the median wall time; then
times one full hierarchical refit (quick settings) for the ratio. Target:
median <= 0.2 s on a 2-core machine and >= 100x faster than a refit.

    python benchmarks/forecast_speed.py
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import pandas as pd

import bayes_grpo as bg


def synthetic_log(n_steps: int = 1000, seed: int = 0) -> bg.RunLog:
    """A realistic noisy 3-phase reward log (slow start, rise, plateau) with outliers."""
    rng = np.random.default_rng(seed)
    t = np.arange(1, n_steps + 1) / n_steps
    curve = 0.2 + 0.6 * (1 - np.exp(-((t / 0.35) ** 2.5)))
    reward = curve + 0.08 * rng.standard_t(4, n_steps)
    frame = pd.DataFrame({"step": np.arange(1, n_steps + 1), "reward": reward})
    return bg.read_log(frame, run_id="speed", family="qwen", params_b=1.5, total_steps=2 * n_steps, reward_range=(0.0, 1.0))


def main() -> None:
    warnings.simplefilter("ignore")
    model = bg.default_model()
    run = synthetic_log()
    model.forecast(run)  # warm-up (imports, caches)
    times = []
    for seed in range(30):
        started = time.perf_counter()
        model.forecast(run, seed=seed)
        times.append(time.perf_counter() - started)
    median = float(np.median(times))
    print(f"forecast of a 1000-step log: median {median:.3f} s, p90 {np.quantile(times, 0.9):.3f} s over {len(times)} calls")

    runs = list(bg.load_runs())[:12]
    started = time.perf_counter()
    bg.fit(runs, draws=200, tune=200, progressbar=False)
    refit = time.perf_counter() - started
    print(f"full refit of the hierarchy on {len(runs)} runs (200 draws, 200 tune): {refit:.1f} s")
    print(f"speed-up: {refit / median:.0f}x (target >= 100x); target median <= 0.2 s: {'met' if median <= 0.2 else 'MISSED'}")


if __name__ == "__main__":
    main()
