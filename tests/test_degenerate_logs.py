"""Degenerate logs get coherent decisions and say what is rough about them (issue 39, item 6)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

import bayes_grpo as bg
from bayes_grpo.prepare import LONG_PLAN_FACTOR
from bayes_grpo.stopping import StopDecision


def _constant(n: int = 40, value: float = 0.5, total: int = 100) -> bg.RunLog:
    return bg.RunLog("const", pd.DataFrame({"step": np.arange(1, n + 1), "reward": np.full(n, value)}), bg.RunMetadata(total_steps=total))


def test_a_flat_log_without_a_range_keeps_training_and_says_why():
    with pytest.warns(UserWarning, match="all equal"):
        decision = bg.default_model().stop_decision(_constant(), seed=0)
    text = decision.explain()
    assert decision.reason == "flat" and not decision.should_stop
    assert "every reward logged so far is 0.5" in text and "reward_range" in text
    assert "e-09" not in text and "still rising" not in text


def test_a_flat_log_on_a_declared_range_is_judged_on_the_range():
    decision = bg.default_model().stop_decision(_constant(), seed=0, reward_range=(0.0, 1.0))
    assert decision.scale == 1.0 and "less than 0.02 more reward is to come (2% of the reward range, 1;" in decision.explain()


@pytest.mark.parametrize("probability,words", [(0.02, "cannot rule out a rise"), (0.8, "still rising")])
def test_the_rising_reason_matches_its_probability(probability, words):
    decision = StopDecision(
        probability=0.5, expected_gain=0.01, gain_interval=(0.0, 0.02), plateau_step=120.0, plateau_interval=(100.0, 150.0),
        should_stop=False, reason="rising", compute_saved=0.5, step=100, total_steps=200, threshold=0.99, tolerance=0.02,
        scale=0.3, relative_to="spread", best_step=100, declining=False, rise_probability=probability, recovery_probability=1.0,
    )  # fmt: skip
    assert words in decision.explain()


def test_a_plan_far_beyond_the_log_is_warned_about():
    run = bg.read_log(pd.DataFrame({"step": np.arange(1, 21), "reward": np.linspace(0.1, 0.3, 20)}))
    with pytest.warns(UserWarning, match=f"more than {LONG_PLAN_FACTOR} times the last logged step 20"):
        bg.default_model().forecast(run, total_steps=1_000_000, seed=0)


def test_rough_draws_become_caveats():
    model = bg.default_model()
    fc = model.forecast(_constant(n=20).head(10), total_steps=100, seed=0, reward_range=(0.0, 1.0))
    assert any("about 42 effective draws" in note for note in replace(fc, ess=42.0, pareto_k=0.3).caveats)
    assert not any("effective draws" in note for note in replace(fc, ess=900.0, pareto_k=0.3).caveats)
    rng = np.random.default_rng(0)
    runs = [bg.read_log(pd.DataFrame({"step": np.arange(1, 61), "reward": 0.3 + 0.4 * (1 - np.exp(-np.arange(60) / (10 + 5 * i))) + 0.01 * rng.standard_normal(60)}), run_id=f"r{i}", total_steps=100) for i in range(3)]
    ranking = model.rank(runs, seed=0)
    expected = [f"{run_id}: {note}" for run_id, fc in zip(ranking.run_ids, ranking.forecasts) for note in fc.caveats]
    # the advice to declare a range nothing bounds comes once for the sweep (tests/test_reward_ceiling.py), the rest per run
    assert [note for note in ranking.caveats if not note.startswith("nothing bounds the reward of ")] == [
        note for note in expected if "nothing bounds the reward" not in note
    ]
