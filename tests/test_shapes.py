"""The canonical shapes (:mod:`evaluation.shapes`): generators with the intended properties, and the suite's bookkeeping."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bayes_grpo import measures
from evaluation import shapes

PROGRESS = np.linspace(0.0, 1.0, 2001)


@pytest.mark.parametrize("name", list(shapes.SHAPES))
def test_level_on_the_reward_scale_and_rising_where_it_should(name):
    curve = shapes.level(name, PROGRESS)
    assert np.all((curve >= 0.0) & (curve <= 1.0))
    if shapes.SHAPES[name].rising:
        assert np.all(np.diff(curve) >= -1e-12)


def test_shapes_do_what_their_names_say():
    level = shapes.level
    assert level("straight", 0.0) == pytest.approx(0.1) and level("straight", 1.0) == pytest.approx(0.9)
    assert np.ptp(np.diff(level("straight", PROGRESS))) < 1e-12  # a constant slope
    assert level("concave", 0.25) == pytest.approx(0.1 + 0.8 * 0.5)
    for name, centre in (("late_40", 0.4), ("late_60", 0.6)):
        assert level(name, centre - 0.15) < 0.15 and level(name, centre) == pytest.approx(0.5, abs=0.01) and level(name, 1.0) == pytest.approx(0.9)
    two = level("two_stage", np.array([0.25, 0.5, 1.0]))
    assert two[0] == pytest.approx(0.4, abs=0.01) and two[1] - two[0] < 0.03 and two[2] == pytest.approx(0.9)
    assert level("early_plateau", 0.25) == pytest.approx(0.7, abs=0.01) and np.ptp(level("early_plateau", PROGRESS[PROGRESS >= 0.3])) < 0.002
    decline = level("rise_decline", PROGRESS)
    assert decline.max() > 0.68 and decline[-1] == pytest.approx(0.4, abs=0.01) and np.all(np.diff(decline[PROGRESS > 0.5]) < 0)
    assert np.ptp(level("flat", PROGRESS)) == 0.0
    assert sorted(set(np.round(level("staircase", PROGRESS), 9))) == pytest.approx([0.1, 0.3, 0.5, 0.7, 0.9])


def test_dip_falls_and_recovers():
    curve = shapes.level("dip", PROGRESS)
    lo, hi = shapes.SHAPES["dip"].dip
    before = curve[PROGRESS < lo].max()
    inside = curve[(PROGRESS >= lo) & (PROGRESS <= hi)]
    assert 0.2 < lo < 0.45 < hi < 0.6
    assert inside.min() < before - 0.25  # a real dip, not noise
    assert curve[-1] >= before - 1e-6 and np.all(curve[PROGRESS > 0.7] >= before - 1e-3)  # back to where it was
    assert shapes.in_dip("dip", 0.45 * 1000, 1000) and not shapes.in_dip("dip", 0.7 * 1000, 1000)
    assert not any(shapes.in_dip(name, 450, 1000) for name in shapes.SHAPES if name != "dip")


def test_run_is_a_complete_log_with_its_plan():
    run = shapes.make_run("concave", total_steps=250, noise=0.05, seed=3)
    assert len(run) == 250 and run.total_steps == 250 and list(run.steps[[0, -1]]) == [1, 250]
    assert run.reward_range is None and run.meta.extra == {"shape": "concave", "noise": 0.05, "seed": 3}
    assert run.run_id == "concave-T250-noise0.05-seed3"
    head = measures.cut(run, 0.3)
    assert head.last_step == 75 and head.total_steps == 250


def test_seeds_reproduce_and_differ():
    a = shapes.make_run("dip", 250, 0.08, seed=1)
    assert np.array_equal(a.rewards, shapes.make_run("dip", 250, 0.08, seed=1).rewards)
    assert not np.array_equal(a.rewards, shapes.make_run("dip", 250, 0.08, seed=2).rewards)
    # different cells never share noise
    noise_a = a.rewards - shapes.level("dip", a.steps / 250)
    other = shapes.make_run("straight", 250, 0.08, seed=1)
    assert not np.allclose(noise_a, other.rewards - shapes.level("straight", other.steps / 250))


def test_declared_range_clips_the_rewards():
    run = shapes.make_run("straight", 250, 0.08, seed=0, reward_range=(0, 1))
    assert run.reward_range == (0.0, 1.0) and run.rewards.min() >= 0.0 and run.rewards.max() <= 1.0
    assert shapes.make_run("straight", 250, 0.08, seed=0).rewards.max() > 1.0  # the unclipped run does leave it


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"shape": "wiggle"}, "unknown shape"), ({"total_steps": 2}, "at least 3"), ({"total_steps": 10.5}, "whole number"), ({"noise": -0.1}, "noise")],
)
def test_bad_arguments_say_what_is_wrong(kwargs, message):
    with pytest.raises(ValueError, match=message):
        shapes.make_run(**{"shape": "flat", **kwargs})


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(list(shapes.SHAPES)),
    total=st.integers(3, 3000),
    noise=st.floats(0.0, 0.3),
    seed=st.integers(0, 2**40),
)
def test_any_parameters_give_a_valid_run_around_its_level(name, total, noise, seed):
    run = shapes.make_run(name, total, noise, seed)
    assert len(run) == total == run.total_steps and np.all(np.isfinite(run.rewards))
    residual = run.rewards - shapes.level(name, run.steps / total)
    if name == "flat_no_signal":  # no group disagrees any more: the logged reward stops moving at all
        idle = run.steps / total >= shapes.NO_SIGNAL_FROM
        assert np.all(residual[idle] == 0.0)
        residual = residual[~idle]
    if noise == 0.0:
        assert np.all(residual == 0.0)
    else:
        assert np.max(np.abs(residual), initial=0.0) < 7 * noise  # Gaussian noise of that scale, no outliers
        if residual.size >= 500:
            assert np.std(residual) == pytest.approx(noise, rel=0.15)


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(list(shapes.SHAPES)), total=st.integers(3, 3000), seed=st.integers(0, 10_000), lo=st.floats(-1.0, 0.5), width=st.floats(0.5, 3.0))
def test_a_declared_range_always_holds_the_rewards(name, total, seed, lo, width):
    run = shapes.make_run(name, total, 0.1, seed, reward_range=(lo, lo + width))
    assert np.all((run.rewards >= lo) & (run.rewards <= lo + width))


def test_cells_cover_the_grid_longest_first():
    grid = shapes.cells()
    assert len(grid) == len(shapes.SHAPES) * len(shapes.LENGTHS) * len(shapes.NOISES) * shapes.SEEDS
    assert [c.total_steps for c in grid] == sorted((c.total_steps for c in grid), reverse=True)
    assert len(set(grid)) == len(grid) and all(c.cuts == shapes.CUTS and c.setting == "learned" for c in grid)
    assert {c.setting for c in shapes.cells(["flat"], settings=shapes.SETTINGS)} == {"learned", "declared"}
    with pytest.raises(ValueError, match="unknown setting"):
        shapes.cells(settings=("both",))
    with pytest.raises(ValueError, match="unknown shape"):
        shapes.cells(["wiggle"])


def _rows(shape: str, fraction: float, covered: list[bool], p_plateau: list[float], stop_in_dip: bool = False) -> list[dict]:
    return [
        {
            "setting": "learned", "shape": shape, "fraction": fraction, "covered_90": c, "covered_50": c, "above_q95": not c, "below_q05": False,
            "quantile_score": 0.1, "width_90": 1.0, "p_plateau": p, "p_take_off_ahead": 1 - p, "p_decline": 0.0,
            "stop": stop_in_dip, "stop_in_dip": stop_in_dip,
        }  # fmt: skip
        for c, p in zip(covered, p_plateau)
    ]


def test_summary_and_spec_checks_judge_the_rows():
    scores = pd.DataFrame(
        _rows("straight", 0.3, [True, True, True], [0.1, 0.2, 0.6])
        + _rows("straight", 0.5, [True, False, True], [0.1, 0.1, 0.1])
        + _rows("two_stage", 0.3, [False], [0.9])
        + _rows("dip", 0.5, [True, True], [0.5, 0.5], stop_in_dip=True)
    )
    summary = shapes.summarise(scores)
    assert list(summary["shape"]) == ["straight", "straight", "two_stage", "dip"]  # the order of SHAPES
    assert summary.loc[1, "coverage_90"] == pytest.approx(2 / 3) and summary.loc[0, "p_plateau_max"] == 0.6
    checks = shapes.spec_checks(scores).set_index(["check", "shape", "fraction"])
    assert checks.loc[("90% coverage", "straight", 0.3), "verdict"] == "met"
    assert checks.loc[("90% coverage", "straight", 0.5), "verdict"] == "missed"
    assert checks.loc[("plateau weight, largest", "straight", 0.3), "verdict"] == "missed"
    assert checks.loc[("plateau weight, largest", "straight", 0.5), "verdict"] == "met"
    assert checks.loc[("weight of a rise ahead, mean", "two_stage", 0.3), ["figure", "verdict"]].tolist() == pytest.approx([0.1, "reported"])
    dip = checks.xs("stops inside the dip", level="check")
    assert dip["figure"].iloc[0] == 2 and dip["verdict"].iloc[0] == "missed"


# ------------------------------------------------------------------ behaviour spec, through the shipped model
# What a user should get from bg.default_model() on runs whose future is known: a run still climbing at the
# cut is forecast to keep climbing, a plateau is called only when the log shows one, a dip is not a decline.


def _forecast(shape: str, fraction: float, noise: float = 0.05, total: int = 250) -> dict:
    """The suite's row for one cut: evaluate_run's scores plus the stop decision."""
    (row,) = shapes.score_cell(shapes.Cell(shape, total, noise, 0, cuts=(fraction,)))
    return row


def _shown(row: dict) -> str:
    return f"truth {row['truth']:.3f}, 90% interval [{row['q05']:.3f}, {row['q95']:.3f}], P(plateau) {row['p_plateau']:.3f}"


@pytest.mark.parametrize("fraction", [0.3, 0.5])  # missed until model 4.0's calibration layer (benchmarks/results/shapes.md)
def test_straight_rise_is_forecast_to_keep_rising(fraction):
    row = _forecast("straight", fraction)
    assert row["covered_90"], _shown(row)
    assert row["p_plateau"] < 0.5, _shown(row)


def test_early_plateau_is_covered_and_may_be_stopped():
    row = _forecast("early_plateau", 0.5)
    assert row["covered_90"], _shown(row)
    assert row["stop"], f"{_shown(row)}; the rule did not stop a run flat since 20% of its steps"


@pytest.mark.parametrize("noise", shapes.NOISES)
def test_no_stop_inside_a_dip_that_recovers(noise):
    import bayes_grpo as bg

    run = shapes.make_run("dip", 250, noise, seed=0)
    inside = [step for step in range(80, 145, 5) if shapes.in_dip("dip", step, 250)]  # every 2% of the run through the dip
    stops = [step for step in inside if bg.default_model().stop_decision(run.head(step), total_steps=250, seed=0).should_stop]
    lo, hi = shapes.SHAPES["dip"].dip
    assert len(inside) >= 10 and not stops, f"stopped inside the dip at step(s) {stops} of 250 (the dip spans steps {lo * 250:.0f}-{hi * 250:.0f})"


@pytest.mark.parametrize("fraction", [0.3, 0.5])
def test_flat_run_interval_holds_the_truth(fraction):
    row = _forecast("flat", fraction)
    assert row["covered_90"], _shown(row)
