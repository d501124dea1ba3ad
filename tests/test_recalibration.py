"""The calibration layer: learned offsets calibrate what they were learned on, move forecasts as the
benchmark scores them, travel in the model file with the id of their fit, and leave the raw model reachable."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

import bayes_grpo as bg
from bayes_grpo import recalibration
from bayes_grpo.errors import ModelError
from bayes_grpo.prepare import prepare_run
from bayes_grpo.recalibration import GROUPS, LEVELS, Recalibration, learn, learned_level, signal_group


def held_out_rows(n: int, seed: int) -> pd.DataFrame:
    """Forecasts too narrow and too low where std_rel is high (late take-offs), as the raw model's are."""
    rng = np.random.default_rng(seed)
    std_rel = np.exp(rng.normal(0, 1, n))
    centre = rng.normal(0, 1, n)
    truth = centre + rng.normal(0, 1, n) * (1 + std_rel) + 0.5 * std_rel
    rows = {"truth": truth, "std_rel": std_rel, "yardstick": np.full(n, 1.0)}
    for level in LEVELS:  # a forecast of unit spread around the centre: overconfident for high std_rel
        rows[recalibration.latent_column(level)] = centre + norm.ppf(level) * 0.6
    return pd.DataFrame(rows)


def test_offsets_calibrate_each_level_in_every_third_they_were_learned_on():
    rows = held_out_rows(900, 0)
    layer = learn(rows)
    groups = rows["std_rel"].map(lambda v: signal_group(v, layer.edges))
    for group in ("low", "high"):
        part = rows[groups == group]
        for level in (0.05, 0.5, 0.95):  # the outer levels with the margin sources need (3% and 97%)
            moved = part[recalibration.latent_column(level)] + np.interp(level, LEVELS, layer.offsets[group]) * part["yardstick"]
            assert np.mean(part["truth"] <= moved) == pytest.approx(learned_level(level), abs=0.02), (group, level)
    # The open future (high std_rel) gets a wider and higher upper tail than the low half.
    assert layer.offsets["high"][-1] > layer.offsets["low"][-1]


def test_a_group_with_too_few_rows_takes_the_pooled_offsets():
    rows = held_out_rows(120, 1)
    rows.loc[:, "std_rel"] = np.where(np.arange(len(rows)) < 5, np.nan, rows["std_rel"])
    layer = learn(rows)
    assert layer.learned_on["rows_per_group"]["unknown"] == 5
    pooled = learn(rows.assign(std_rel=1.0)).offsets["low"]
    assert layer.offsets["unknown"] == pytest.approx(pooled)


@settings(max_examples=60, deadline=None)
@given(
    offsets=st.lists(st.floats(-3, 3), min_size=len(LEVELS), max_size=len(LEVELS)).map(sorted),
    seed=st.integers(0, 1000),
)
def test_applied_layer_moves_each_trajectory_by_one_offset_and_leaves_the_last_logged_level(offsets, seed):
    rng = np.random.default_rng(seed)
    run = bg.read_log(pd.DataFrame({"step": np.arange(1, 31), "reward": rng.normal(0, 0.1, 30), "reward_std": np.full(30, 0.3)}), total_steps=100)
    prepared = prepare_run(run)
    layer = Recalibration(edges=(0.0,), offsets=dict.fromkeys(GROUPS, tuple(offsets)))
    steps = np.array([30.0, 50.0, 100.0])
    draws = rng.normal(0, 1, (200, steps.size)).cumsum(axis=1)
    moved = layer.apply(draws, prepared, steps)
    assert moved[:, 0] == pytest.approx(draws[:, 0])  # W = 0 at the last logged step
    shift = moved - draws
    moving = np.abs(shift[:, 2]) > 1e-9
    ratios = shift[moving, 1] / shift[moving, 2]  # one offset per draw, times each step's yardstick: one ratio for all
    assert np.allclose(ratios, ratios[0]) if ratios.size else True
    # Non-decreasing offsets keep the end level's order.
    order = np.argsort(draws[:, -1])
    assert np.all(np.diff(moved[order, -1]) >= -1e-9)


def test_the_layer_moves_a_real_forecasts_final_window_by_the_offsets_it_learned(quick_model, few_runs):
    """What the layer learns (truth against the draws' mean over the final window, per level) is what it moves."""
    run = few_runs[0]
    head, total = run.head(int(run.steps[len(run) // 3])), int(run.total_steps or run.steps[-1])
    offsets = (-0.4, -0.1, 0.0, 0.2, 0.9)
    layer = Recalibration(edges=(0.0,), offsets=dict.fromkeys(GROUPS, offsets))
    model = dataclasses.replace(quick_model, recalibration=layer)
    window = run.steps[-max(1, len(run) // 10) :].astype(float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw = model.forecast(head, total_steps=total, seed=3, calibrated=False)
        moved = model.forecast(head, total_steps=total, seed=3)
    assert moved.calibrated and not raw.calibrated
    before = np.quantile(raw.mean_over(raw.draws, window), LEVELS)
    after = np.quantile(moved.mean_over(moved.draws, window), LEVELS)
    expected = np.minimum(before + np.array(offsets) * recalibration.window_yardstick(raw, window), raw.prepared.bounds[1] if raw.prepared.bounds else np.inf)
    assert after == pytest.approx(expected, abs=0.05 * (before[-1] - before[0]) + 1e-9)


def test_the_layer_is_saved_with_its_fit_id_and_refused_for_another_fit(quick_model, tmp_path):
    layer = Recalibration(edges=(0.0,), offsets=dict.fromkeys(GROUPS, (-0.2, 0.0, 0.0, 0.1, 0.5)), fit_id=quick_model.fit_id)
    path = dataclasses.replace(quick_model, recalibration=layer).save(tmp_path / "m.nc", full=False)
    loaded = bg.load_model(path)
    assert loaded.recalibration == layer and loaded.fit_id == quick_model.fit_id
    stale = dataclasses.replace(layer, fit_id="0" * 16)
    path = dataclasses.replace(quick_model, recalibration=stale).save(tmp_path / "stale.nc", full=False)
    with pytest.raises(ModelError, match="calibration layer was learned for fit 0000000000000000"):
        bg.load_model(path)


def test_the_shipped_model_carries_a_layer_for_its_own_fit():
    model = bg.default_model()
    assert model.recalibration is not None and model.recalibration.fit_id == model.fit_id
    assert model.recalibration.learned_on["sources"] >= 40
