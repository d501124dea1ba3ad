"""The hierarchical model and forecasts: recovery, API, save/load, honesty on flat runs."""

from __future__ import annotations

import dataclasses
import json
import shutil
import warnings

import arviz as az
import h5netcdf
import numpy as np
import pandas as pd
import pytest
import xarray as xr

import bayes_grpo as bg
from bayes_grpo.config import ModelConfig, SamplerConfig, merge
from bayes_grpo.curves import fit_paper_law, reward_curve
from bayes_grpo.errors import ModelError
from bayes_grpo.model import DEFAULT_MODEL_PATH, FORMAT_ATTR, FORMAT_VERSION
from bayes_grpo.sampling import NON_CENTRED_TARGET_ACCEPT, _diagnose, target_accept
from bayes_grpo.population import MIXED_MIN_RUNS, MODEL_VERSION, OFFSETS, SHEARED_GAIN
from bayes_grpo.pymc_model import build_model, resolve_parameterisation
from bayes_grpo.prepare import LONG_PLAN_FACTOR, prepare_run
from evaluation.settings import shared_runs_dir

SHARED = shared_runs_dir()
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
        model = bg.fit(
            runs,
            model_config=ModelConfig(form="weibull"),
            sampler_config={"draws": 200, "tune": 500, "chains": 2, "progressbar": False, "seed": 1},
        )
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
    # The cost of the fit, per chain: the slowest chain's mean leapfrog steps per draw.
    per_chain = model.idata.sample_stats["n_steps"].mean("draw").values
    assert model.diagnostics.steps_per_draw == pytest.approx(per_chain.max()) and per_chain.min() >= 1
    assert f"steps/draw (slowest chain)={per_chain.max():.0f}" in str(model.diagnostics)


@pytest.mark.slow
def test_save_load_round_trip(simulated_fit, tmp_path):
    model, runs, _ = simulated_fit
    assert model.model_config.form == "weibull" and model.sampler_config.draws == 200 and model.sampler_config.tune == 500
    # 8 runs sample their per-run parameters as offsets, at the higher target acceptance; the file says so.
    assert model.model_config.parameterisation == "non_centred" and model.sampler_config.target_accept == NON_CENTRED_TARGET_ACCEPT
    assert model.fitted_on["runs"] == [r.run_id for r in runs] and model.fitted_on["n_runs"] == len(runs)
    path = model.save(tmp_path / "m.nc")
    assert list(tmp_path.iterdir()) == [path], "save writes exactly one file"
    loaded = bg.load_model(path)
    assert loaded.form == model.form and loaded.families == model.families
    assert loaded.model_config == model.model_config and loaded.sampler_config == model.sampler_config
    assert loaded.size_centres == pytest.approx(model.size_centres) and loaded.fitted_on == model.fitted_on
    assert loaded.diagnostics == model.diagnostics
    before = model.forecast(runs[0].head(40), seed=3).to_frame()
    after = loaded.forecast(runs[0].head(40), seed=3).to_frame()
    pd.testing.assert_frame_equal(before, after)
    assert loaded.idata is not None and "log_likelihood" in loaded.idata
    compact = bg.load_model(model.save(tmp_path / "compact" / "m.nc", full=False))
    assert compact.idata is None and set(compact.population.data_vars) == set(model.population.data_vars)
    assert (tmp_path / "compact" / "m.nc").stat().st_size < path.stat().st_size


@pytest.mark.slow
def test_diagnostics_name_the_runs_the_chains_disagree_on(simulated_fit, tmp_path):
    # The simulated fit's own draws, with one run's curve moved in its second chain: what a run
    # with two explanations looks like when each chain settles on one of them.
    model, runs, _ = simulated_fit
    posterior = model.idata.posterior.copy(deep=True)
    split = runs[3].run_id
    moved = posterior["tau"].loc[{"run": split}]
    posterior["tau"].loc[{"chain": 1, "run": split}] = moved.sel(chain=1) + 6 * float(moved.std())
    diag = _diagnose(az.InferenceData(posterior=posterior, sample_stats=model.idata.sample_stats), "nutpie", 1.0)
    assert diag.unmixed_runs[0] == split and not diag.ok
    assert split not in model.diagnostics.unmixed_runs
    assert f"chains disagree on runs: {', '.join(diag.unmixed_runs)}" in str(diag)
    # The names travel with the model file.
    with_names = dataclasses.replace(model, diagnostics=diag)
    assert bg.load_model(with_names.save(tmp_path / "m.nc", full=False)).diagnostics == diag


def test_load_model_refuses_what_is_not_a_model_file(tmp_path):
    with pytest.raises(ModelError, match="not a saved bayes_grpo model"):
        bg.load_model(tmp_path)
    with pytest.raises(ModelError, match="no such model file"):
        bg.load_model(tmp_path / "missing.nc")
    foreign = tmp_path / "foreign.nc"
    xr.Dataset({"x": ("i", np.arange(3.0))}).to_netcdf(foreign, engine="h5netcdf")
    with pytest.raises(ModelError, match="not a saved bayes_grpo model") as info:
        bg.load_model(foreign)
    assert "\n" not in str(info.value)
    text = tmp_path / "notes.nc"
    text.write_text("hello")
    with pytest.raises(ModelError, match="not a saved bayes_grpo model"):
        bg.load_model(text)


def test_load_model_refuses_another_format_version(tmp_path):
    path = tmp_path / "old.nc"
    shutil.copyfile(DEFAULT_MODEL_PATH, path)
    with h5netcdf.File(path, "a") as handle:
        handle.attrs[FORMAT_ATTR] = FORMAT_VERSION + 1
    with pytest.raises(ModelError, match=f"format {FORMAT_VERSION + 1}"):
        bg.load_model(path)


def test_a_file_written_before_a_prior_setting_existed_is_read_with_its_old_prior(tmp_path):
    """A model file whose stored priors lack ``spread_prior`` / ``fixed_start_sd`` (before model 2.5) was fitted with
    HalfNormal spreads and a learned start spread: it is read so, not with today's defaults."""
    path = tmp_path / "old.nc"
    shutil.copyfile(DEFAULT_MODEL_PATH, path)
    with h5netcdf.File(path, "a") as handle:
        handle.attrs.pop("recalibration", None)  # such a file had no calibration layer ...
        handle.attrs.pop("sweep_coupling", None)  # ... and no stored sweep coupling
        stored = json.loads(handle.attrs["model_config"])
        for name in ("spread_prior", "fixed_start_sd"):
            stored["priors"].pop(name)
        handle.attrs["model_config"] = json.dumps(stored)
    old = bg.load_model(path).model_config.priors
    assert (old.spread_prior, old.fixed_start_sd) == ("halfnormal", (None, None))
    current = bg.default_model().model_config.priors
    assert (current.spread_prior, current.fixed_start_sd) == ("gamma", (None, 0.12)) == (ModelConfig().priors.spread_prior, ModelConfig().priors.fixed_start_sd)


def test_default_model_is_one_small_versioned_file_that_loads_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = bg.default_model()
    assert model.families and model.form == "loglogistic"
    assert DEFAULT_MODEL_PATH.stat().st_size < 5 * 1024**2
    with h5netcdf.File(DEFAULT_MODEL_PATH, "r") as handle:
        attrs = dict(handle.attrs)
    assert int(attrs[FORMAT_ATTR]) == FORMAT_VERSION and attrs["package_version"] == bg.__version__
    assert json.loads(attrs["model_config"])["form"] == "loglogistic"
    sources = model.fitted_on["sources"]
    assert model.fitted_on["runs"] and model.fitted_on["n_runs"] == sum(sources.values()), "the default model records what it was fitted on"
    assert sources["bundled (data/runs)"] == len(model.fitted_on["runs"]) == len(bg.load_runs())
    assert model.fitted_on["model_version"] == MODEL_VERSION, "the shipped posterior is the current model"
    assert model.diagnostics is not None and model.diagnostics.max_r_hat <= 1.01


def test_configs_take_overrides_and_refuse_unknown_settings():
    assert merge(ModelConfig(), {"max_bins": 30, "priors": {"tau_sd_scale": 0.5}}).max_bins == 30
    merged = merge(ModelConfig(), {"priors": {"tau_sd_scale": 0.5}})
    assert merged.priors.tau_sd_scale == 0.5 and merged.priors.gain_sd_scale == ModelConfig().priors.gain_sd_scale
    assert ModelConfig.from_dict(ModelConfig(form="logistic").to_dict()) == ModelConfig(form="logistic")
    assert merge(SamplerConfig(seed=3), None) == SamplerConfig(seed=3)
    with pytest.raises(ModelError, match="unknown curve form"):
        ModelConfig(form="cubic")
    with pytest.raises(ModelError, match="unknown parameterisation"):
        ModelConfig(parameterisation="centered")
    with pytest.raises(ModelError, match="unknown model_config setting"):
        merge(ModelConfig(), {"max_bin": 3})
    with pytest.raises(ModelError, match="sampler_config.sampler"):
        SamplerConfig(sampler="hmc")
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ModelError, match="target_accept must be between 0 and 1"):
            SamplerConfig(target_accept=bad)
    with pytest.raises(ModelError, match="unknown sampler_config setting"):
        bg.fit([simulated_run("x", "qwen", 0.3, seed=0)], sampler_config={"draw": 10})


def test_target_acceptance_is_the_one_given_else_picked_by_the_fit():
    """None picks by the geometry: offsets (small fits) 0.95; otherwise nutpie 0.8, the others 0.9."""
    offsets, mixed = ModelConfig(parameterisation="non_centred"), ModelConfig(parameterisation="mixed")
    assert target_accept(SamplerConfig(sampler="nutpie"), offsets) == NON_CENTRED_TARGET_ACCEPT == 0.95
    assert target_accept(SamplerConfig(sampler="nutpie"), mixed) == 0.8
    assert target_accept(SamplerConfig(sampler="pymc"), mixed) == target_accept(SamplerConfig(sampler="numpyro"), mixed) == 0.9
    assert target_accept(SamplerConfig(sampler="nutpie", target_accept=0.85), offsets) == 0.85
    # "auto" is resolved by run count before the pick: fewer than MIXED_MIN_RUNS runs are offsets.
    assert target_accept(SamplerConfig(sampler="nutpie"), resolve_parameterisation(ModelConfig(), MIXED_MIN_RUNS - 1)) == 0.95
    assert target_accept(SamplerConfig(sampler="nutpie"), resolve_parameterisation(ModelConfig(), MIXED_MIN_RUNS)) == 0.8


def test_sampler_defaults_follow_quick_mode(monkeypatch):
    monkeypatch.setenv("BAYES_GRPO_QUICK", "1")
    assert SamplerConfig().draws == 200 and SamplerConfig().tune == 200
    monkeypatch.setenv("BAYES_GRPO_QUICK", "0")
    assert SamplerConfig().draws == 4000 and SamplerConfig().tune == 1000 and SamplerConfig().chains == 2


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
    # The real runs' population (learned scale, 120 runs) has seen many flat heads take off, so the median
    # may move up by about a quarter of the spread, but not by a rise of the size of the spread.
    assert abs(forecast.final.quantile(0.5) - 0.4) < 0.3 * spread
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


@pytest.mark.skipif(SHARED is None, reason="no shared external runs (set BAYES_GRPO_SHARED_RUNS)")
def test_forecasts_of_every_external_run_from_30_percent():
    """Every shared run forecasts from 30% of its log. A plan hundreds of times the log (five runs logged
    99-235 steps of 28,000-56,000) cannot be forecast from the run itself: that forecast warns, says so in
    its caveats and is the population's, so it need not have good importance weights."""
    model = bg.default_model()
    for run in bg.load_runs(SHARED / "runs"):
        head = run.head(int(run.steps[max(2, int(0.3 * len(run.steps))) - 1]))
        total = int(run.total_steps or run.steps[-1])
        if total > LONG_PLAN_FACTOR * head.last_step:
            with pytest.warns(UserWarning, match="extrapolates far beyond what the log shows"):
                forecast = model.forecast(head, total_steps=total)
            assert any("the log shows nothing of where the plan ends" in note for note in forecast.caveats), run.run_id
        else:
            forecast = model.forecast(head, total_steps=total)
            assert forecast.ess > 50, run.run_id
        assert np.isfinite(forecast.to_frame().to_numpy()).all(), run.run_id


def test_paper_law_point_fit_recovers_a_sigmoid():
    t = np.linspace(0.01, 1, 100)
    y = 0.1 + 0.7 / (1 + np.exp(-12 * (t - 0.4)))
    law = fit_paper_law(t, y)
    assert law.t0 == pytest.approx(0.4, abs=0.02)
    assert law.delta == pytest.approx(12, rel=0.1)
    assert law.slow_start_end < law.t0 < law.plateau_start


def test_paper_law_point_fit_of_a_falling_head_raises_no_overflow_warning():
    # A falling head drives the fit to a steep sigmoid far from the data, where exp(-delta (t - t0)) overflowed.
    t = np.linspace(0.002, 0.2, 100)
    y = 0.8 - 2.5 * t + np.random.default_rng(0).normal(0, 0.02, t.size)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        law = fit_paper_law(t, y)
    assert np.sqrt(np.mean((law.predict(t) - y) ** 2)) < 0.05


@pytest.mark.parametrize(
    "parameterisation, sampled",
    [
        ("centred", {SHEARED_GAIN, "log_tau", "log_beta", "r0", "log_sigma"}),
        ("non_centred", set(OFFSETS.values())),
        ("mixed", {SHEARED_GAIN, "log_tau", "e_beta", "e_r0", "log_sigma"}),
    ],
)
def test_each_parameterisation_samples_the_per_run_parameters_it_names(parameterisation, sampled):
    runs = [simulated_run(f"p{i}", "qwen", 0.4, seed=i, n_steps=80) for i in range(2)]
    model = build_model([prepare_run(r) for r in runs], ModelConfig(parameterisation=parameterisation, max_bins=20))
    free = {v.name for v in model.free_RVs}
    assert sampled <= free and not ({"r0", "e_r0"} - sampled) & free
    assert {"gain", "tau", "beta", "r0", "sigma"} <= set(model.named_vars)  # the per-run parameters either way


def test_sheared_gain_starts_at_the_observed_rise_and_a_mixed_fit_keeps_its_log_likelihood():
    """The sheared gain starts at asinh(observed rise); a fit with it samples and still computes the pointwise log-likelihood."""
    runs = [simulated_run(f"m{i}", "qwen" if i % 2 else "llama", gain, seed=i, n_steps=80) for i, gain in enumerate([0.1, 0.6, 0.3, 0.5])]
    config = ModelConfig(parameterisation="mixed", max_bins=20)
    model = build_model([prepare_run(r) for r in runs], config)
    start = model.initial_point()[SHEARED_GAIN]
    # Ordered like the runs' gains (0.6 > 0.3 > 0.1), the fast riser a little below its 0.6: its first rewards have risen already.
    assert start[1] > start[2] > start[0] > 0.0
    assert 0.4 < np.sinh(start[1]) < 0.65

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        fitted = bg.fit(runs, model_config=config, draws=100, tune=100, seed=3, progressbar=False)
    assert SHEARED_GAIN in fitted.idata.posterior and "asinh_gain" in fitted.idata.posterior
    assert fitted.idata.log_likelihood["z_obs"].shape[-1] == sum(min(20, r.steps.size) for r in runs)
