"""Forecasting one metric: per-function components, --metric / --minimize / --components, a sparse evaluation metric."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

import bayes_grpo as bg
from bayes_grpo.cli import main
from bayes_grpo.components import SPREAD_LEFT_MIN, forecast_components, plot_components, reward_functions, spread_left
from bayes_grpo.report import component_panel
from bayes_grpo.settings import bundled_runs_dir

BUNDLED = bundled_runs_dir() / "llama-m-sort4-noise0.8-lr0.0001-s0.csv"
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "external_runs" / "runs"
GSM8K = SHARED / "semioz_llama3.1-8b_gsm8k.csv"


@pytest.fixture(scope="module")
def model():
    return bg.default_model()


def test_components_forecast_each_function_on_its_own_scale(model):
    run = bg.read_log(BUNDLED).head(90)
    components = forecast_components(model, run, seed=0)
    assert [c.name for c in components] == reward_functions(run) == ["correctness", "format", "length", "partial_credit"]
    for c in components:
        np.testing.assert_array_equal(c.forecast.observed_rewards, run.signal(f"rewards/{c.name}/mean"))
        assert c.forecast.total_steps == 300 and c.spread_left is None  # the bundled runs log no per-function std
    figure = plot_components(components, Figure())
    assert sum(ax.get_visible() for ax in figure.axes) == 4


def test_a_function_without_spread_left_is_saturated(model):
    steps = np.arange(1, 101)
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({
        "step": steps, "reward": 0.5 + 0.004 * steps,
        "rewards/fmt/mean": np.minimum(0.5, 0.05 * steps), "rewards/fmt/std": np.maximum(0.0, 0.3 - 0.03 * steps),
        "rewards/acc/mean": 0.004 * steps + rng.normal(0, 0.02, steps.size), "rewards/acc/std": np.full(steps.size, 0.4),
    })  # fmt: skip
    run = bg.read_log(frame, total_steps=300)
    assert spread_left(run, "fmt") == 0.0 and spread_left(run, "acc") == pytest.approx(1.0)
    fmt, acc = forecast_components(model, run, seed=0)
    assert fmt.saturated and "no spread left" in fmt.reason
    assert "no spread left" not in acc.reason and acc.spread_left > SPREAD_LEFT_MIN


def test_report_component_panel(model):
    figure, table = component_panel(model, bg.read_log(BUNDLED))
    assert list(table["function"]) == ["correctness", "format", "length", "partial_credit"]
    assert table["truth"].notna().all() and len(figure.axes) >= 4


def test_cli_forecast_components(capsys, tmp_path):
    assert main(["forecast", str(BUNDLED), "--at", "90", "--components", "--rows", "2", "--plot", str(tmp_path / "fan.png")]) == 0
    out = capsys.readouterr().out
    assert "reward functions (each forecast as a run of its own, to step 300):" in out
    assert len(re.findall(r"^  (correctness|format|length|partial_credit) +now ", out, re.M)) == 4
    assert (tmp_path / "fan-components.png").stat().st_size > 0


def test_cli_forecast_a_reward_function_with_its_range(capsys):
    assert main(["forecast", str(BUNDLED), "--at", "90", "--metric", "rewards/correctness", "--reward-range", "0", "1"]) == 0
    out = capsys.readouterr().out
    assert "forecast of rewards/correctness/mean from step 90 to 300" in out
    lo, hi = map(float, re.search(r"90% \[([-\d.e]+), ([-\d.e]+)\]", out).groups())
    assert 0 <= lo < hi <= 1


@pytest.mark.skipif(not GSM8K.is_file(), reason="shared runs not available")
def test_cli_forecast_a_shared_runs_correctness_function(capsys):
    """A real run with five reward functions: where will correctness end up?"""
    assert main(["forecast", str(GSM8K), "--at", "100", "--metric", "rewards/correctness_reward_func"]) == 0
    assert "forecast of rewards/correctness_reward_func/mean from step 100 to 250" in capsys.readouterr().out
    assert main(["forecast", str(GSM8K), "--at", "100", "--metric", "nope"]) == 2
    assert "it has: " in (err := capsys.readouterr().err) and "rewards/correctness_reward_func/mean" in err


def test_minimize_forecasts_a_falling_loss_in_its_own_units(capsys, model):
    run = bg.read_log(BUNDLED, metric="loss", direction="minimize").head(150)
    fc = model.forecast(run, seed=0)
    assert main(["forecast", str(BUNDLED), "--at", "150", "--metric", "loss", "--minimize", "--rows", "2"]) == 0
    out = capsys.readouterr().out
    assert "forecast of loss (lower is better) from step 150 to 300" in out
    lo, hi = map(float, re.search(r"90% \[([-\d.e]+), ([-\d.e]+)\]", out).groups())
    assert (lo, hi) == pytest.approx((-fc.final.interval(0.9)[1], -fc.final.interval(0.9)[0]), rel=1e-3)


def test_sparse_evaluation_metric_forecasts_with_a_wide_interval(model):
    """An evaluation every 50 steps: six values in 300 steps, forecast from the first three."""
    full = bg.read_log(BUNDLED)
    table = full.table[["step", "reward", "rewards/correctness/mean"]].copy()
    table["eval_correctness"] = table["rewards/correctness/mean"].where(table["step"] % 50 == 0)
    sparse = bg.read_log(table, metric="eval_correctness", total_steps=300)
    assert list(sparse.steps) == [50, 100, 150, 200, 250, 300]
    dense = model.forecast(full.with_metric("rewards/correctness").head(150), seed=0)
    fc = model.forecast(sparse.head(150), seed=0)
    lo, hi = fc.final.interval(0.9)
    assert lo <= sparse.rewards[-1] <= hi
    # Three values leave the model more doubt than 150 (the calibration layer then widens both by yardsticks of
    # their own width and spread, which a 3-point log measures smaller).
    sparse_raw = model.forecast(sparse.head(150), seed=0, calibrated=False).final.interval(0.9)
    dense_raw = model.forecast(full.with_metric("rewards/correctness").head(150), seed=0, calibrated=False).final.interval(0.9)
    assert np.subtract(*sparse_raw[::-1]) > np.subtract(*dense_raw[::-1])


def test_a_function_that_never_scored_is_constant_and_neither_forecast_nor_drawn(model, tmp_path, capsys):
    """Issue 48, item 9: a reward function at 0 on every step was called "saturated: no spread left" and drawn on a 1e-8 axis."""
    steps = np.arange(1, 101)
    acc = np.clip(0.1 + 0.004 * steps + np.random.default_rng(0).normal(0, 0.03, steps.size), 0, 1)
    frame = pd.DataFrame({
        "step": steps, "reward": acc, "reward_std": np.full(steps.size, 0.4),
        "rewards/acc/mean": acc, "rewards/acc/std": np.full(steps.size, 0.4),
        "rewards/never/mean": np.zeros(steps.size), "rewards/never/std": np.zeros(steps.size),
    })  # fmt: skip
    acc_fc, never = forecast_components(model, bg.read_log(frame, total_steps=300), seed=0)
    assert never.constant and never.forecast is None and never.level == 0.0
    assert not never.saturated and "never scored" in never.status and "no spread left" not in never.status
    assert not acc_fc.constant and acc_fc.forecast is not None
    figure = plot_components([acc_fc, never], Figure())
    assert sum(ax.get_visible() for ax in figure.axes) == 1  # only the function that moved is drawn

    log = tmp_path / "never.csv"
    frame.to_csv(log, index=False)
    plot = tmp_path / "fan.png"
    assert main(["forecast", str(log), "--total-steps", "300", "--components", "--rows", "2", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("  never "))
    assert "constant: never scored" in row and "saturated" not in row and "final" not in row
    assert re.search(r"^  acc +now .* still moving$", out, re.M)
    assert (tmp_path / "fan-components.png").stat().st_size > 0
