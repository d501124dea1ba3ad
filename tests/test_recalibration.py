"""The calibration layer: learned from held-out forecasts it keeps the share of the predicted change that the
median's error asks for and calibrates each level it was learned on, moves forecasts as the benchmark scores them,
travels in the model file with the id of its fit, and leaves the raw model reachable."""

from __future__ import annotations

import dataclasses
import json
import warnings

import h5netcdf
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
from bayes_grpo.recalibration import LEVELS, Recalibration, learn, learned_level
from bayes_grpo.settings import PERSISTENCE_POINTS


def held_out_rows(n: int, seed: int, realised: float = 0.5) -> pd.DataFrame:
    """Forecasts that predict a change of which only ``realised`` comes true, too narrow where reward_std is high, and
    whose upside grows with the excursion the run has shown."""
    rng = np.random.default_rng(seed)
    anchor = rng.normal(0, 1, n)
    predicted = rng.normal(0, 1, n)
    signal = np.exp(rng.normal(-1, 0.5, n))
    shown = np.where(rng.random(n) < 0.3, rng.exponential(1.0, n), 0.0)
    upside = rng.normal(0, 1, n)
    upside = np.where(upside > 0, 2.0 * upside, 0.3 * upside)  # skewed upwards, median 0
    truth = anchor + realised * predicted + rng.normal(0, 1, n) * (0.3 + signal) + upside * shown
    rows = {
        "truth": truth, "spread": np.ones(n), "anchor": anchor, "ahead": np.full(n, 0.7), "width_ahead": np.full(n, 0.7), "signal_scale": signal,
        "excursion": shown, "logged": rng.uniform(0.2, 0.5, n), "take_off": rng.uniform(0.0, 0.6, n),
    }  # fmt: skip
    for level in LEVELS:  # a forecast of its own narrow width around the predicted change
        rows[recalibration.raw_column(level)] = anchor + predicted + norm.ppf(level) * 0.2
    return pd.DataFrame(rows)


def _moved(rows: pd.DataFrame, layer: Recalibration, level: float) -> np.ndarray:
    """A level's quantile after the layer, as :meth:`Recalibration.apply` moves the final window."""
    latent = rows[recalibration.raw_column(level)]
    if level < 0.5:  # below the median: the drawn-in width and the learning signal over the horizon
        scale = layer.beta * rows["width_ahead"] + rows["ahead"] * rows["signal_scale"]
    else:  # above it: the room for a take-off, shrinking with the share of the plan left unless the model sees one ahead
        room = rows["signal_scale"] + recalibration.excursion_weight(level) * rows["excursion"]
        time_left = (1 - rows["logged"]) ** recalibration.TIME_LEFT_POWER
        scale = rows["ahead"] * (time_left + (1 - time_left) * rows["take_off"]) * room
    return rows["anchor"] + layer.beta * (latent - rows["anchor"]) + np.interp(level, LEVELS, layer.offsets) * scale


def test_beta_keeps_the_share_of_the_predicted_change_that_comes_true():
    for realised in (0.3, 0.6, 1.0):
        layer = learn(held_out_rows(3000, 0, realised))
        assert layer.beta == pytest.approx(realised, abs=0.1), realised
        assert layer.offsets[LEVELS.index(0.5)] == 0.0  # beta places the median


def _pinball(rows: pd.DataFrame, quantile: np.ndarray, level: float) -> float:
    miss = rows["truth"] - quantile
    return float(np.mean(np.where(miss >= 0, level * miss, (level - 1) * miss)))


def test_the_tails_hold_their_share_the_inner_levels_minimise_the_score_and_the_median_beats_persistence():
    rows = held_out_rows(2000, 1)
    layer = learn(rows)
    for level in recalibration.OUTER_LEVELS:  # counted by row, with the margin sources need
        assert np.mean(rows["truth"] <= _moved(rows, layer, level)) == pytest.approx(learned_level(level), abs=0.03), level
    assert np.mean(rows["truth"] <= _moved(rows, layer, 0.5)) == pytest.approx(0.5, abs=0.03)
    lower = _moved(rows, layer, 0.25)
    for nudge in (-0.1, 0.1):  # the 25% offset is the quantile score's minimiser: moving it either way scores worse
        nudged = dataclasses.replace(layer, offsets=tuple(v + nudge if lv == 0.25 else v for lv, v in zip(LEVELS, layer.offsets)))
        assert _pinball(rows, lower, 0.25) <= _pinball(rows, _moved(rows, nudged, 0.25), 0.25), nudge
    central = np.mean((rows["truth"] >= lower) & (rows["truth"] <= _moved(rows, layer, 0.75)))
    assert central >= recalibration.CENTRAL_HOLD - 0.01, central
    error = np.mean(np.abs(_moved(rows, layer, 0.5) - rows["truth"]))
    assert error < np.mean(np.abs(rows["anchor"] - rows["truth"]))
    assert error < np.mean(np.abs(rows[recalibration.raw_column(0.5)] - rows["truth"]))


def test_learning_names_missing_columns_and_refuses_rows_without_steps_ahead():
    rows = held_out_rows(50, 2)
    with pytest.raises(ModelError, match="signal_scale"):
        learn(rows.drop(columns="signal_scale"))
    with pytest.raises(ModelError, match="excursion"):
        learn(rows.drop(columns="excursion"))
    with pytest.raises(ModelError, match="logged"):
        learn(rows.drop(columns="logged"))
    with pytest.raises(ModelError, match="take_off"):
        learn(rows.drop(columns="take_off"))
    with pytest.raises(ModelError, match="steps ahead"):
        learn(rows.assign(ahead=0.0))


@settings(max_examples=60, deadline=None)
@given(
    offsets=st.lists(st.floats(-3, 3), min_size=len(LEVELS), max_size=len(LEVELS)).map(sorted).map(lambda o: [v - o[LEVELS.index(0.5)] for v in o]),
    beta=st.floats(0, 1),
    seed=st.integers(0, 1000),
)
def test_applied_layer_draws_towards_persistence_moves_each_trajectory_by_one_offset_and_keeps_the_log(offsets, beta, seed):
    rng = np.random.default_rng(seed)
    rewards = rng.normal(0, 0.1, 30)
    run = bg.read_log(pd.DataFrame({"step": np.arange(1, 31), "reward": rewards, "reward_std": np.full(30, 0.3)}), total_steps=100)
    prepared = prepare_run(run)
    steps = np.array([30.0, 50.0, 100.0])
    draws = rng.normal(0, 1, (200, steps.size)).cumsum(axis=1)
    moved = Recalibration(beta=beta, offsets=tuple(offsets)).apply(draws, prepared, steps, take_off=0.3)
    assert moved[:, 0] == pytest.approx(draws[:, 0])  # the last logged step is not moved
    anchor = float(np.mean(rewards[-PERSISTENCE_POINTS:]))
    drawn_in = anchor + beta * (draws - anchor)
    shift = moved[:, 1:] - drawn_in[:, 1:]
    rank = (np.argsort(np.argsort(draws[:, -1])) + 0.5) / draws.shape[0]
    for side in (rank < 0.5, (rank > 0.5) & (rank < recalibration.EXCURSION_FROM)):  # W below the median, (1 - t)^k R h above (v(p) = 0)
        moving = side & (np.abs(shift[:, 1]) > 1e-9)
        ratios = shift[moving, 0] / shift[moving, 1]  # one offset per draw, times each step's yardstick: one ratio per side
        assert np.allclose(ratios, ratios[0]) if ratios.size else True
    order = np.argsort(draws[:, -1])  # non-decreasing offsets keep the end level's order
    assert np.all(np.diff(moved[order, -1]) >= -1e-9)


def test_without_offsets_and_with_beta_one_the_layer_changes_nothing():
    run = bg.read_log(pd.DataFrame({"step": np.arange(1, 31), "reward": np.linspace(0, 1, 30)}), total_steps=100)
    draws = np.random.default_rng(0).normal(0, 1, (100, 3))
    steps = np.array([30.0, 60.0, 100.0])
    assert Recalibration(beta=1.0, offsets=(0.0,) * len(LEVELS)).apply(draws, prepare_run(run), steps, take_off=0.5) == pytest.approx(draws)


def test_the_yardstick_reads_no_learning_signal_as_no_extra_room():
    """R is the recent reward_std, 0 for a run that has lost its learning signal (not the logged spread: a run with no
    advantage to learn from is not an open future); the logged spread stands in for a log without a positive recent
    reward_std, such as a chance streak of quiet steps in a log of small groups."""
    rewards = np.tile([1.77, 2.36, 2.94], 20)  # the batch mean moves while every group agrees

    def prepared(spreads):
        table = pd.DataFrame({"step": np.arange(1, 61), "reward": rewards, **({} if spreads is None else {"reward_std": spreads})})
        return prepare_run(bg.read_log(table, total_steps=200))

    assert recalibration.signal_scale(prepared(np.zeros(60))) == 0.0
    small_groups = np.r_[np.tile([0.0, 0.0, 1.4], 16), np.zeros(12)]  # quiet steps the norm: 12 in a row come by chance
    assert prepared(small_groups).signal_exhausted is False
    assert recalibration.signal_scale(prepared(small_groups)) == pytest.approx(recalibration.signal_scale(prepared(None)))
    assert recalibration.signal_scale(prepared(np.full(60, 0.4))) == pytest.approx(0.4)
    assert recalibration.signal_scale(prepared(None)) == pytest.approx(np.quantile(rewards, 0.9) - np.quantile(rewards, 0.1), rel=0.05)
    layer = Recalibration(beta=0.5, offsets=(-0.5, -0.2, 0.0, 0.4, 4.0))
    steps = np.array([60.0, 130.0, 200.0])
    draws = np.random.default_rng(1).normal(2.3, 0.05, (400, steps.size))
    quiet, open_ = (np.quantile(layer.apply(draws, prepared(s), steps, take_off=0.0)[:, -1], 0.95) for s in (np.zeros(60), None))
    assert quiet < open_ - 1.0


def test_the_excursion_is_the_best_logged_reward_beyond_the_noise_and_widens_only_the_upper_tail():
    """U is how far the best logged reward lies above the persistence level beyond what noise reaches in as many
    steps (about 0 for a flat noisy log; the spikes' height for one whose batches reached higher), in reward units,
    and it moves only the quantiles above the 75% level, all of it at the 95% level."""
    rng = np.random.default_rng(3)
    flat = 0.2 + rng.normal(0, 0.03, 60)
    spiky = flat.copy()
    spiky[[10, 25]] = 0.9

    def prepared(rewards):
        table = pd.DataFrame({"step": np.arange(1, 61), "reward": rewards, "reward_std": np.full(60, 0.1)})
        return prepare_run(bg.read_log(table, total_steps=200))

    noise_only = [recalibration.excursion(prepared(0.2 + np.random.default_rng(seed).normal(0, 0.03, 60))) for seed in range(20)]
    assert np.median(noise_only) < 0.5 * 0.03 and max(noise_only) < 3 * 0.03
    shown = recalibration.excursion(prepared(spiky))
    assert 0.55 < shown < 0.7  # 0.9 - 0.2, less the reach of 60 steps' noise (about 2.1 SDs of 0.03)
    assert recalibration.excursion(prepared(3.0 * spiky + 1.0)) == pytest.approx(3.0 * shown, rel=1e-6)
    quiet = pd.DataFrame({"step": np.arange(1, 61), "reward": spiky, "reward_std": np.r_[np.full(40, 0.1), np.zeros(20)]})
    assert recalibration.excursion(prepare_run(bg.read_log(quiet, total_steps=200))) == 0.0  # no signal left to climb with
    layer = Recalibration(beta=0.5, offsets=(-0.5, -0.2, 0.0, 0.4, 2.0))
    steps = np.array([60.0, 130.0, 200.0])
    draws = np.random.default_rng(1).normal(0.2, 0.05, (400, steps.size))
    plain, wide = (np.quantile(layer.apply(draws, prepared(r), steps, take_off=0.0)[:, -1], (0.05, 0.25, 0.5, 0.74, 0.95)) for r in (flat, spiky))
    assert wide[:4] == pytest.approx(plain[:4])
    assert recalibration.excursion_weight([0.5, 0.75, 0.85, 0.95, 0.99]) == pytest.approx([0.0, 0.0, 0.5, 1.0, 1.0])
    time_left = (1 - 60 / 200) ** recalibration.TIME_LEFT_POWER  # the room above the median shrinks with the plan's share left (no take-off seen)
    assert wide[4] - plain[4] == pytest.approx(2.0 * 0.7 * time_left * (shown - recalibration.excursion(prepared(flat))), rel=0.05)


def test_above_the_median_the_yardstick_is_the_room_for_a_take_off_and_it_shrinks_with_the_plan_left():
    """Form 3: below the median the yardstick is the drawn-in width plus the learning signal over the horizon, and
    neither the share of the plan logged nor the model's take-off weight changes it. Above the median it is the
    learning signal and the excursion over the horizon, without the forecast's own width, times the live share of that
    room: the square of the share of the plan left for a take-off the model does not see, all of it for one it sees."""
    terms = {"beta": 0.6, "ahead": 0.4, "width_ahead": 0.3, "signal_scale": 0.5, "excursion": 0.2}
    levels = np.array([0.05, 0.25, 0.75, 0.95])
    early, late = (recalibration.yardstick(**terms, logged=t, take_off=0.0, level=levels) for t in (0.2, 0.5))
    assert early[:2] == pytest.approx(late[:2]) and early[0] == pytest.approx(0.6 * 0.3 + 0.4 * 0.5)
    assert early[2] == pytest.approx(0.4 * 0.8**2 * 0.5) and early[3] == pytest.approx(0.4 * 0.8**2 * (0.5 + 0.2))
    assert late[2:] == pytest.approx(early[2:] * (0.5 / 0.8) ** 2)
    seen = recalibration.yardstick(**terms, logged=0.5, take_off=1.0, level=levels)
    assert seen[:2] == pytest.approx(late[:2]) and seen[3] == pytest.approx(0.4 * (0.5 + 0.2))
    half = recalibration.yardstick(**terms, logged=0.5, take_off=0.5, level=0.95)
    assert half == pytest.approx(0.4 * (0.25 + 0.75 * 0.5) * (0.5 + 0.2))
    assert recalibration.yardstick(**{**terms, "width_ahead": 3.0}, logged=0.2, take_off=0.0, level=0.95) == pytest.approx(early[3])


def test_the_layer_moves_a_real_forecasts_final_window_as_it_learned(quick_model, few_runs):
    """What the layer learns (truth against the raw forecast's final-window reward, logging noise included, per
    level) is what it moves: the calibrated window reward is the learned transform of the raw one, not the raw one
    with the noise added again after the layer."""
    run = few_runs[0]
    head, total = run.head(int(run.steps[len(run) // 3])), int(run.total_steps or run.steps[-1])
    layer = Recalibration(beta=0.6, offsets=(-0.4, -0.1, 0.0, 0.2, 0.9))
    model = dataclasses.replace(quick_model, recalibration=layer)
    window = run.steps[-max(1, len(run) // 10) :].astype(float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw = model.forecast(head, total_steps=total, seed=3, calibrated=False)
        moved = model.forecast(head, total_steps=total, seed=3)
    assert moved.calibrated and not raw.calibrated
    bounds = raw.prepared.bounds or (-np.inf, np.inf)  # the layer moves the model's own draws; a range bounds what it shows
    assert np.clip(moved.raw.draws, *bounds) == pytest.approx(raw.draws) and raw.raw.draws == pytest.approx(moved.raw.draws)
    terms = recalibration.window_terms(moved.raw, window)
    before = moved.raw.window_reward(window, bounded=False).quantile(np.asarray(LEVELS))
    row = pd.DataFrame({**terms, **{recalibration.raw_column(p): [v] for p, v in zip(LEVELS, before)}}, index=[0])
    expected = np.array([_moved(row, layer, p)[0] for p in LEVELS])
    if raw.prepared.bounds:
        expected = np.clip(expected, *raw.prepared.bounds)
    after = moved.window_reward(window).quantile(np.asarray(LEVELS))
    assert after == pytest.approx(expected, abs=0.01 * (before[-1] - before[0]) + 1e-9)
    assert moved.final.samples == pytest.approx(moved.window_reward(moved.final_window_steps()).samples)


def test_the_top_offset_holds_in_every_third_of_the_learning_signal_and_is_never_lowered():
    """A middle third of std_rel whose late take-offs overshoot the pooled 95% quantile gets its own, wider top
    offset; the other thirds keep the pooled one, and each third's tail holds its share of the truths."""
    rows = held_out_rows(3000, 4)
    rows["std_rel"] = np.exp(np.random.default_rng(5).uniform(-3, 0, len(rows)))
    middle = (rows["std_rel"] > np.exp(-2)) & (rows["std_rel"] <= np.exp(-1))
    rows.loc[middle, "truth"] += np.where(np.random.default_rng(6).random(middle.sum()) < 0.15, 3.0 * rows.loc[middle, "signal_scale"], 0.0)
    layer = learn(rows)
    assert layer.signal_edges == pytest.approx((-2.0, -1.0), abs=0.1)
    low, mid, high = layer.top_by_signal
    assert low == high == layer.offsets[-1] < mid
    top = max(LEVELS)
    for third in (rows["std_rel"] <= np.exp(-2), middle, rows["std_rel"] > np.exp(-1)):
        offset = layer.top_by_signal[int(np.searchsorted(layer.signal_edges, np.log(rows.loc[third, "std_rel"].iloc[0])))]
        moved = _moved(rows[third], dataclasses.replace(layer, offsets=(*layer.offsets[:-1], offset), signal_edges=(), top_by_signal=()), top)
        assert np.mean(rows.loc[third, "truth"] <= moved) >= learned_level(top) - 0.03
    no_thirds = learn(rows.drop(columns="std_rel"))
    assert no_thirds.top_by_signal == () and no_thirds.offsets == layer.offsets
    assert learn(rows.assign(std_rel=np.nan)).top_by_signal == ()  # no log with reward_std: pooled only
    assert learn(rows.head(50)).top_by_signal == ()  # too few rows for a quantile per third


def test_a_run_gets_the_top_offset_of_its_third_and_a_run_without_reward_std_the_pooled_one():
    rewards = np.linspace(0.2, 0.6, 40) + 0.02 * np.sin(np.arange(40))

    def prepared(spreads):
        table = pd.DataFrame({"step": np.arange(1, 41), "reward": rewards, **({} if spreads is None else {"reward_std": spreads})})
        return prepare_run(bg.read_log(table, total_steps=200))

    layer = Recalibration(beta=0.5, offsets=(-0.5, -0.2, 0.0, 0.4, 3.0), signal_edges=(-2.0, -1.0), top_by_signal=(3.0, 6.0, 3.5))
    quiet, middle, loud = (prepared(np.full(40, s)) for s in (0.01, 0.1, 0.5))
    assert [recalibration.std_rel(p) for p in (quiet, middle, loud)] == sorted(recalibration.std_rel(p) for p in (quiet, middle, loud))
    assert np.log(recalibration.std_rel(middle)) == pytest.approx(-1.5, abs=0.5)
    assert [layer.offsets_for(p)[-1] for p in (quiet, middle, loud, prepared(None))] == [3.0, 6.0, 3.5, 3.0]
    steps = np.array([40.0, 120.0, 200.0])
    draws = np.random.default_rng(2).normal(0.6, 0.05, (400, steps.size))
    pooled = dataclasses.replace(layer, signal_edges=(), top_by_signal=())
    wider, same = (np.quantile(lay.apply(draws, middle, steps, take_off=0.0)[:, -1], 0.97) for lay in (layer, pooled))
    assert wider > same
    assert Recalibration.from_json(layer.to_json()) == layer
    with pytest.raises(ModelError, match="at or above the pooled"):
        Recalibration(beta=0.5, offsets=(-0.5, -0.2, 0.0, 0.4, 3.0), signal_edges=(-2.0, -1.0), top_by_signal=(2.0, 6.0, 3.5))
    with pytest.raises(ModelError, match="2 ordered edges"):
        Recalibration(beta=0.5, offsets=(-0.5, -0.2, 0.0, 0.4, 3.0), signal_edges=(-1.0, -2.0), top_by_signal=(3.0, 6.0, 3.5))


def test_the_layer_is_saved_with_its_fit_id_and_refused_for_another_fit(quick_model, tmp_path):
    layer = Recalibration(beta=0.55, offsets=(-0.2, 0.0, 0.0, 0.1, 0.5), fit_id=quick_model.fit_id)
    path = dataclasses.replace(quick_model, recalibration=layer).save(tmp_path / "m.nc", full=False)
    loaded = bg.load_model(path)
    assert loaded.recalibration == layer and loaded.fit_id == quick_model.fit_id
    stale = dataclasses.replace(layer, fit_id="0" * 16)
    path = dataclasses.replace(quick_model, recalibration=stale).save(tmp_path / "stale.nc", full=False)
    with pytest.raises(ModelError, match="calibration layer was learned for fit 0000000000000000"):
        bg.load_model(path)


def test_a_layer_of_the_earlier_form_is_refused_and_a_file_holding_one_loads_raw_with_a_warning(quick_model, tmp_path):
    old = json.dumps({"edges": [0.0], "offsets": {"low": [0, 0, 0, 0, 1]}, "fit_id": quick_model.fit_id})
    with pytest.raises(ModelError, match="relearn it"):
        Recalibration.from_json(old)
    with pytest.raises(ModelError, match="relearn it"):  # offsets that are not one flat row of numbers
        Recalibration.from_json(json.dumps({"beta": 0.5, "offsets": [[-0.2, 0, 0, 0.1, 0.5]], "fit_id": quick_model.fit_id}))
    with pytest.raises(ModelError, match="non-decreasing"):
        Recalibration(beta=0.5, offsets=(1.0, 0.0, 0.0, 0.0, 0.0))
    with pytest.raises(ModelError, match="offset at the median is 0"):
        Recalibration(beta=0.5, offsets=(-1.0, -0.5, -0.2, 0.0, 0.5))
    with pytest.raises(ModelError, match="yardstick of another bayes_grpo"):  # offsets learned without the excursion
        Recalibration.from_json(json.dumps({"beta": 0.5, "offsets": [-0.2, 0, 0, 0.1, 0.5], "fit_id": quick_model.fit_id}))
    layer = Recalibration(beta=0.5, offsets=(-0.2, 0.0, 0.0, 0.1, 0.5), fit_id=quick_model.fit_id)
    path = dataclasses.replace(quick_model, recalibration=layer).save(tmp_path / "m40.nc", full=False)
    with h5netcdf.File(path, "a") as handle:
        handle.attrs["recalibration"] = old
    with pytest.warns(UserWarning, match="earlier bayes_grpo.*raw model's"):
        loaded = bg.load_model(path)
    assert loaded.recalibration is None and loaded.fit_id == quick_model.fit_id


def test_the_shipped_model_carries_a_layer_for_its_own_fit():
    model = bg.default_model()
    assert model.recalibration is not None and model.recalibration.fit_id == model.fit_id
    assert model.recalibration.learned_on["sources"] >= 40 and 0 < model.recalibration.beta < 1
