"""The hierarchical model and forecasts: recovery, API, save/load, honesty on flat runs."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import bayes_grpo as bg
from bayes_grpo.curves import fit_paper_law, reward_curve
from bayes_grpo.errors import ModelError

EXTERNAL = Path(__file__).resolve().parents[2] / "shared" / "external_runs" / "runs"
TRUE_TAU = {"qwen": 0.15, "llama": 0.35}


def simulated_run(run_id: str, family: str, gain: float, seed: int, n_steps: int = 120, form: str = "weibull") -> bg.RunLog:
    """A run drawn from a known curve (Weibull by default, beta 2) on a declared 0..1 reward range."""
    rng = np.random.default_rng(seed)
    steps = np.arange(1, n_steps + 1)
    t = steps / n_steps
    mean = reward_curve(form, t, 0.2, gain, TRUE_TAU[family], 2.0)
    frame = pd.DataFrame({"step": steps, "reward": mean + 0.03 * rng.standard_normal(n_steps)})
    return bg.read_log(frame, run_id=run_id, family=family, params_b=0.001, total_steps=n_steps, reward_range=(0.0, 1.0))


@pytest.fixture(scope="module")
def simulated_fit() -> tuple[bg.FittedModel, list[bg.RunLog], dict[str, float]]:
    gains = {}
    runs = []
    for i in range(8):
        family = "qwen" if i % 2 == 0 else "llama"
        gain = 0.3 + 0.06 * i
        run = simulated_run(f"sim-{i}", family, gain, seed=i)
        runs.append(run)
        gains[run.run_id] = gain
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = bg.fit(runs, form="weibull", draws=200, tune=300, chains=2, progressbar=False, seed=1)
    return model, runs, gains


@pytest.mark.slow
def test_fit_recovers_known_parameters(simulated_fit):
    model, runs, gains = simulated_fit
    posterior = model.idata.posterior
    fitted_gain = posterior["gain"].mean(("chain", "draw")).to_series()
    fitted_tau = posterior["tau"].mean(("chain", "draw")).to_series()
    for run in runs:
        assert fitted_gain[run.run_id] == pytest.approx(gains[run.run_id], abs=0.05)
        assert fitted_tau[run.run_id] == pytest.approx(TRUE_TAU[run.family], rel=0.25)
    # The family difference in timescale is learned by the population (qwen faster than llama).
    fam_tau = posterior["fam_tau"].mean(("chain", "draw")).to_series()
    assert fam_tau["qwen"] < fam_tau["llama"]
    assert model.diagnostics is not None and model.diagnostics.max_r_hat < 1.1


@pytest.mark.slow
def test_save_load_round_trip(simulated_fit, tmp_path):
    model, runs, _ = simulated_fit
    model.save(tmp_path / "m")
    loaded = bg.load_model(tmp_path / "m")
    assert loaded.form == model.form and loaded.families == model.families
    before = model.forecast(runs[0].head(40), seed=3).to_frame()
    after = loaded.forecast(runs[0].head(40), seed=3).to_frame()
    pd.testing.assert_frame_equal(before, after)
    assert loaded.idata is not None and "log_likelihood" in loaded.idata


def test_load_model_rejects_a_folder_that_is_not_a_model(tmp_path):
    with pytest.raises(ModelError, match="not a saved bayes_grpo model"):
        bg.load_model(tmp_path)


def test_default_model_loads_offline_and_is_small(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = bg.default_model()
    assert model.families
    folder = Path(bg.model.__file__).parent / "assets" / "default_model"
    assert sum(f.stat().st_size for f in folder.iterdir()) < 5 * 1024**2
    assert model.config["runs"], "the default model records which runs it was fitted on"


def test_forecast_frame_is_a_valid_fan_up_to_total_steps():
    run = simulated_run("api", "qwen", 0.5, seed=11, n_steps=200).head(60)
    forecast = bg.default_model().forecast(run)
    frame = forecast.to_frame()
    assert list(frame.columns) == ["step", "mean", "q05", "q25", "q50", "q75", "q95"]
    assert frame["step"].iloc[-1] == 200
    q = frame[["q05", "q25", "q50", "q75", "q95"]].to_numpy()
    assert np.all(np.diff(q, axis=1) >= -1e-12)
    assert forecast.final.quantile(0.05) <= forecast.final.mean <= forecast.final.quantile(0.95)


def test_forecast_of_a_run_in_progress_follows_its_rise():
    # Log-logistic rise (midpoint at 15% of the run), cut at 30%: two thirds of the gain is in.
    run = simulated_run("rising", "qwen", 0.6, seed=5, n_steps=200, form="loglogistic")
    forecast = bg.default_model().forecast(run.head(60))
    truth = reward_curve("loglogistic", 1.0, 0.2, 0.6, TRUE_TAU["qwen"], 2.0)
    low, high = forecast.final.interval(0.9)
    assert low <= truth <= high
    assert forecast.final.quantile(0.5) == pytest.approx(truth, abs=0.1)


@pytest.mark.parametrize("observed", [60, 200])
def test_flat_run_forecast_does_not_invent_a_rise(observed):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"step": np.arange(1, 201), "reward": 0.4 + 0.05 * rng.standard_normal(200)})
    run = bg.read_log(frame, run_id="flat", family="llama", params_b=1.0, total_steps=200)
    forecast = bg.default_model().forecast(run.head(observed))
    spread = np.ptp(frame["reward"])
    assert abs(forecast.final.quantile(0.5) - 0.4) < 0.15 * spread
    if observed == 200:
        low, high = forecast.final.interval(0.9)
        assert high - low < 0.5 * spread


def test_forecast_of_a_run_not_yet_started():
    model = bg.default_model()
    forecast = model.forecast(None, family="qwen", params_b=1.5, initial_reward=0.2, total_steps=300, reward_range=(0.0, 1.0))
    frame = forecast.to_frame()
    assert frame["step"].iloc[-1] == 300
    assert frame["q50"].iloc[0] == pytest.approx(0.2, abs=0.05)
    with pytest.raises(ModelError, match="reward_range"):
        model.forecast(None, family="qwen", params_b=1.5, initial_reward=0.2, total_steps=300)


def test_forecast_needs_total_steps_when_the_log_has_none():
    frame = pd.DataFrame({"step": np.arange(1, 51), "reward": np.linspace(0, 1, 50)})
    run = bg.read_log(frame, run_id="no-total")
    with pytest.raises(ModelError, match="total_steps"):
        bg.default_model().forecast(run)


@pytest.mark.skipif(not EXTERNAL.is_dir(), reason="../shared/external_runs is not beside this checkout")
def test_forecasts_of_every_external_run_from_30_percent():
    model = bg.default_model()
    for run in bg.load_runs(EXTERNAL):
        head = run.head(int(run.steps[max(2, int(0.3 * len(run.steps))) - 1]))
        forecast = model.forecast(head, total_steps=int(run.total_steps or run.steps[-1]))
        frame = forecast.to_frame()
        assert np.isfinite(frame.to_numpy()).all(), run.run_id
        assert forecast.ess > 50, run.run_id


def test_paper_law_point_fit_recovers_a_sigmoid():
    t = np.linspace(0.01, 1, 100)
    y = 0.1 + 0.7 / (1 + np.exp(-12 * (t - 0.4)))
    law = fit_paper_law(t, y)
    assert law.t0 == pytest.approx(0.4, abs=0.02)
    assert law.delta == pytest.approx(12, rel=0.1)
    assert law.slow_start_end < law.t0 < law.plateau_start
