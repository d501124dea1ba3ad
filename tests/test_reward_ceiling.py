"""Where the reward can go: the ceiling of 0-or-k rewards read off a log, and kept by forecasts and by rank."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import bayes_grpo as bg
from bayes_grpo.prepare import (
    CEILING_MIN_STEPS,
    LATTICE_MAX_COMPLETIONS,
    binary_reward_ceiling,
    completion_range_bounds,
    logged_reward_bounds,
    prepare_run,
    reward_ceiling,
    saturated_outcome_ceiling,
)

EXTERNAL = Path(__file__).resolve().parents[2] / "shared" / "external_runs" / "runs"
BINARY_SWEEP = sorted(EXTERNAL.glob("sunshine535_qwen2.5-7b_gsm8k_exp*.csv"))


def outcome_log(k: float, completions: int, successes: list[int], rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Logged means of ``completions`` 0-or-``k`` outcomes per step, and a mean within-group spread of groups of two (TRL
    before 0.27): each pair's sample SD is 0 or k / sqrt(2). The last step scores k on every completion."""
    successes = [*successes, completions]
    rewards, spreads = [], []
    for m in successes:
        outcomes = rng.permutation(np.r_[np.ones(m), np.zeros(completions - m)]) * k
        pairs = outcomes[: completions // 2 * 2].reshape(-1, 2)
        rewards.append(outcomes.mean())
        spreads.append(pairs.std(axis=1, ddof=1).mean() if len(pairs) else 0.0)
    return np.array(rewards), np.array(spreads)


@settings(max_examples=60, deadline=None)
@given(
    k=st.floats(0.05, 50.0),
    completions=st.integers(8, LATTICE_MAX_COMPLETIONS).filter(lambda n: n % 2 == 0),
    seed=st.integers(0, 2**16),
)
def test_the_ceiling_of_0_or_k_outcomes_is_read_where_the_spread_is_a_mean_within_groups(k: float, completions: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    successes = list(rng.choice(np.arange(completions), size=30))
    rewards, spreads = outcome_log(k, completions, successes, rng)
    assume(np.unique(rewards).size >= 5)
    assert saturated_outcome_ceiling(rewards, spreads) == pytest.approx(k)
    assert saturated_outcome_ceiling(3.0 * rewards, 3.0 * spreads) == pytest.approx(3.0 * k)  # in any units


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), top=st.floats(0.2, 20.0))
def test_no_ceiling_is_read_from_rewards_that_are_not_shares_of_outcomes(seed: int, top: float) -> None:
    """Continuous rewards (a score, a length penalty) fit no grid of a few completions, even with a quiet step at the top."""
    rng = np.random.default_rng(seed)
    rewards = np.r_[rng.uniform(0, top, 40), top]
    spreads = np.r_[rng.uniform(0, 0.2 * top, 40), 0.0]
    assert saturated_outcome_ceiling(rewards, spreads) is None


def test_the_top_must_be_a_step_where_every_completion_scored_it_and_the_spreads_must_fit_0_or_k() -> None:
    rng = np.random.default_rng(0)
    rewards, spreads = outcome_log(1.0, 40, list(rng.integers(0, 40, 30)), rng)
    assert saturated_outcome_ceiling(rewards, spreads) == pytest.approx(1.0)
    quiet_top = spreads.copy()
    quiet_top[rewards == rewards.max()] = 0.05  # no step reached the top with every completion at it: a higher reward may exist
    assert saturated_outcome_ceiling(rewards, quiet_top) is None
    too_wide = spreads.copy()
    too_wide[np.argmin(np.abs(rewards - 0.5))] = 0.9  # more spread than 0-or-1 outcomes allow at a mean near 0.5
    assert saturated_outcome_ceiling(rewards, too_wide) is None
    assert saturated_outcome_ceiling(rewards, None) is None
    assert saturated_outcome_ceiling(rewards - 0.1, spreads) is None  # a negative mean: not 0-or-k


def test_the_spread_identity_comes_first_and_each_ceiling_says_what_showed_it() -> None:
    r = np.linspace(0.1, 0.9, 20)
    ceiling, evidence = reward_ceiling(r, np.sqrt(r * (2.0 - r)))
    assert ceiling == pytest.approx(binary_reward_ceiling(r, np.sqrt(r * (2.0 - r)))) and "reward_std^2" in evidence
    rng = np.random.default_rng(1)
    rewards, spreads = outcome_log(1.0, 40, list(rng.integers(0, 40, 30)), rng)
    ceiling, evidence = reward_ceiling(rewards, spreads)
    assert ceiling == pytest.approx(1.0) and "completions" in evidence
    run = bg.read_log(pd.DataFrame({"step": np.arange(1, rewards.size + 1), "reward": rewards, "reward_std": spreads}), total_steps=100)
    assert prepare_run(run).bounds == (0.0, pytest.approx(1.0))
    fc = bg.default_model().forecast(run, seed=0)
    assert fc.final.samples.max() <= 1.0 and any("0-or-1 outcomes" in note for note in fc.caveats)


@pytest.mark.skipif(not BINARY_SWEEP, reason=f"the shared real runs are not at {EXTERNAL}")
def test_a_real_0_or_1_sweep_logged_by_an_old_trl_is_ranked_within_0_to_1() -> None:
    """A real 0/1 GSM8K sweep (TRL's mean within-group spread, logged every 5 steps), cut at 30%, ranked without a declared
    range: some of its runs show the ceiling, and all five keep it (the others were forecast up to 3.6)."""
    runs = [bg.read_log(path).head(60) for path in BINARY_SWEEP]
    assert len(runs) == 5
    shown = [run.run_id for run in runs if prepare_run(run).reward_ceiling is not None]
    assert 1 <= len(shown) < len(runs)
    ranking = bg.default_model().rank(runs, seed=0)
    assert ranking.finals.max() <= 1.0 and ranking.table["q95"].max() <= 1.0 and ranking.table["mean"].max() < 1.0
    for fc in ranking.forecasts:
        assert fc.prepared.bounds == (0.0, pytest.approx(1.0)) and fc.draws.max() <= 1.0
        if fc.run_id not in shown:
            assert any("of the sweep shows it" in note for note in fc.caveats)


@settings(max_examples=60, deadline=None)
@given(
    k=st.floats(0.01, 100.0), floor=st.sampled_from([0.0, -1.0, -0.5]), steps=st.integers(CEILING_MIN_STEPS, 200),
    seed=st.integers(0, 2**16), moved=st.floats(1e-4, 0.5),
)  # fmt: skip
def test_the_range_is_what_every_step_s_best_and_worst_completion_scored(k: float, floor: float, steps: int, seed: int, moved: float) -> None:
    m = floor * k  # a 0-or-k, or a -k-or-k, score
    rng = np.random.default_rng(seed)
    means = rng.uniform(m, k, steps)
    best, worst = np.full(steps, k), np.full(steps, m)
    assert completion_range_bounds(means, best, worst) == (m, k)
    assert logged_reward_bounds(means, None, (best, worst))[:2] == (m, k)
    step, width = int(rng.integers(steps)), k - m
    above, below = best.copy(), best.copy()
    above[step], below[step] = k + moved * width, k - moved * width
    assert completion_range_bounds(means, above, worst) is None  # a step's best above k: the range is not (m, k)
    assert completion_range_bounds(means, below, worst) is None  # a best that moves: a continuous reward, no range shown
    lifted = worst.copy()
    lifted[step] = m + moved * width
    assert completion_range_bounds(means, best, lifted) is None  # a worst that moves
    short = slice(CEILING_MIN_STEPS - 1)
    assert completion_range_bounds(means[short], best[short], worst[short]) is None
    outside = means.copy()
    outside[step] = k + moved * width  # a mean its completions cannot give
    assert completion_range_bounds(outside, best, worst) is None


def test_a_forecast_nothing_bounds_says_so_and_a_declared_range_bounds_it() -> None:
    rng = np.random.default_rng(0)
    steps = np.arange(1, 41)
    rewards = np.clip(0.1 + 0.002 * steps + rng.normal(0, 0.03, steps.size), 0, None)  # a flat 0/1 accuracy, 40 of 400 steps
    run = bg.read_log(pd.DataFrame({"step": steps, "reward": rewards}), total_steps=400)
    model = bg.default_model()
    fc = model.forecast(run, seed=0)
    q95, ranges = fc.unbounded_tail()
    assert q95 == pytest.approx(fc.final.quantile(0.95)) and ranges > 1.0
    assert any("nothing bounds the reward" in note for note in fc.caveats)
    bounded = model.forecast(run, seed=0, reward_range=(0.0, 1.0))
    assert bounded.unbounded_tail() is None and bounded.final.samples.max() <= 1.0
    assert not any("nothing bounds" in note for note in bounded.caveats)


def test_a_sweep_is_advised_once_to_declare_the_range_nothing_bounds() -> None:
    rng = np.random.default_rng(1)
    steps = np.arange(1, 41)
    heads = [np.clip(0.1 + 0.03 * i + rng.normal(0, 0.03, steps.size), 0, None) for i in range(3)]  # flat accuracies, 40 of 400 steps
    runs = [bg.read_log(pd.DataFrame({"step": steps, "reward": head}), total_steps=400, run_id=f"lr{i}") for i, head in enumerate(heads)]
    ranking = bg.default_model().rank(runs, seed=0)
    unbounded = [fc.unbounded_tail() for fc in ranking.forecasts]
    assert all(tail is not None for tail in unbounded)
    advice = [note for note in ranking.caveats if "nothing bounds the reward" in note]
    assert len(advice) == 1 and advice[0].startswith("nothing bounds the reward of 3 runs (lr0, lr1, lr2)")
    assert f"{min(t[1] for t in unbounded):.1f} to {max(t[1] for t in unbounded):.1f} times" in advice[0]
