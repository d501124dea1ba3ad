"""The stopping backtest: check schedule, regret scoring, baselines, and a real replay with a fitted model."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bayes_grpo as bg
from bayes_grpo.errors import BayesGrpoError
from bayes_grpo.stopping import FixedFractionRule, PatienceRule, StopEvidence, StopRule
from evaluation import backtest, calibration, scoring
from evaluation.calibration import load_evaluation_runs
from evaluation.settings import shared_runs_dir


def _run(rewards: np.ndarray, steps: np.ndarray | None = None, run_id: str = "synthetic") -> bg.RunLog:
    steps = np.arange(1, len(rewards) + 1) if steps is None else steps
    return bg.read_log(pd.DataFrame({"step": steps, "reward": rewards}), run_id=run_id, family="qwen", params_b=0.5)


RISE_THEN_FLAT = np.r_[np.linspace(0.0, 1.0, 50), np.ones(50)]


def test_checks_every_two_percent_from_ten_percent_never_at_the_end() -> None:
    run = _run(RISE_THEN_FLAT)
    indices, fractions = backtest.check_indices(run)
    assert indices[0] == 9 and fractions[0] == pytest.approx(0.10)
    assert np.all(np.diff(indices) == 2) and indices[-1] == 97 and fractions[-1] == pytest.approx(0.98)
    sparse = _run(RISE_THEN_FLAT[::10], steps=np.arange(10, 101, 10))  # logged every 10 steps
    indices, fractions = backtest.check_indices(sparse)
    assert np.all(np.diff(indices) > 0) and indices[0] >= 2 and indices[-1] < len(sparse) - 1
    assert np.all(sparse.steps[indices] <= fractions * 100 + 1e-9)


def test_score_uses_the_measures_regret_and_saved_share() -> None:
    run = _run(RISE_THEN_FLAT)
    never = backtest.score(run, None)
    assert np.isnan(never.pop("dip_z")) and never == {"stop_step": 100, "saved": 0.0, "regret": 0.0, "dip_stop": False, "noise_bad": 0.0}
    early = backtest.score(run, 19)
    assert early["stop_step"] == 20 and early["saved"] == pytest.approx(0.8)
    assert early["regret"] == pytest.approx(scoring.regret(run.steps, run.rewards, 20)) and early["regret"] > 0.5
    assert abs(backtest.score(run, 89)["regret"]) < 0.01


def test_the_smoother_weights_are_the_regrets_smoother() -> None:
    rng = np.random.default_rng(0)
    steps = np.r_[np.arange(1, 40), np.arange(40, 400, 7)].astype(float)  # logged densely, then every 7th step
    rewards = np.sqrt(steps / steps[-1]) + 0.1 * rng.standard_normal(steps.size)
    curve = bg.measures.smoothed(steps, rewards)
    for i in (0, 20, 45, steps.size - 1):
        weights = bg.measures.smoother_weights(steps, steps[i])
        assert weights.sum() == pytest.approx(1.0) and weights @ rewards == pytest.approx(curve[i])


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 700), every=st.integers(1, 9), first=st.integers(0, 50), seed=st.integers(0, 1000),
    span=st.one_of(st.none(), st.floats(1.0, 1e5)), bandwidth=st.floats(1e-4, 0.5),
)  # fmt: skip
def test_the_smoother_on_evenly_spaced_steps_is_the_same_weighted_sums(n, every, first, seed, span, bandwidth) -> None:
    """Evenly spaced logs are smoothed by convolution (no n x n kernel); the values are the direct weighted sums."""
    steps = first + every * np.arange(1, n + 1, dtype=float)
    rewards = np.random.default_rng(seed).normal(0, 1, n)
    direct = bg.measures.smoother_weights(steps, steps, bandwidth, span) @ rewards
    assert bg.measures.smoothed(steps, rewards, bandwidth, span) == pytest.approx(direct, abs=1e-12)


def test_the_chance_that_noise_alone_makes_a_stop_bad_is_what_the_noise_does() -> None:
    """On a run flat from step 30, stops at step 60 count as bad (regret > 0.05) in the share of noise draws the formula says."""
    rng = np.random.default_rng(3)
    steps = np.arange(1, 101, dtype=float)
    level = np.r_[np.linspace(0.0, 1.0, 30), np.ones(70)]
    logs = [level + 0.3 * rng.standard_normal(100) for _ in range(1000)]
    simulated = np.mean([scoring.regret(steps, rewards, 60) > 0.05 for rewards in logs])
    predicted = np.mean([scoring.noise_bad_probability(steps, rewards, 60) for rewards in logs])
    assert 0.2 < simulated < 0.4 and predicted == pytest.approx(simulated, abs=0.04)
    quiet = level + 0.01 * rng.standard_normal(100)
    assert scoring.noise_bad_probability(steps, quiet, 60) < 1e-6  # noise far below 0.05 of the spread
    assert scoring.noise_bad_probability(steps, logs[0], 99) < scoring.noise_bad_probability(steps, logs[0], 60)  # a later stop shares more of S's noise
    assert scoring.noise_bad_probability(steps, logs[0], None) == 0.0 == scoring.noise_bad_probability(steps, logs[0], 100)


def test_the_noise_limited_frontier_saves_what_a_plateau_knowing_rule_can() -> None:
    rng = np.random.default_rng(1)
    quiet = [_run(RISE_THEN_FLAT + 0.001 * rng.standard_normal(100), run_id=f"quiet{i}") for i in range(2)]
    frontier = backtest.noise_limited_frontier(quiet, ["a/x", "b/y"], budgets=(0.0, 0.08))
    oracle = backtest.oracle_rule()(_trace(quiet[0]))
    first = int(quiet[0].steps[backtest.check_indices(quiet[0])[0][np.flatnonzero(oracle)[0]]])  # the oracle's stop, from 50 on
    assert np.allclose(frontier["saved"], (100 - first) / 100, atol=0.02) and np.allclose(frontier["stopped"], 1.0)
    noisy = [_run(RISE_THEN_FLAT + 0.4 * rng.standard_normal(100), run_id=f"noisy{i}") for i in range(6)]
    frontier = backtest.noise_limited_frontier(noisy, [f"s/{i}" for i in range(6)], budgets=(0.02, 0.08, 0.3))
    assert np.all(np.diff(frontier["saved"]) > 0)  # a larger budget of noise-made bad stops allows more to be saved
    assert frontier["saved"].iloc[0] < 0.5 * frontier["saved"].iloc[-1]
    with pytest.raises(ValueError, match="one source per run"):
        backtest.noise_limited_frontier(noisy, ["s/0"])


def test_a_stop_inside_a_dip_that_recovers_is_flagged() -> None:
    steps = np.arange(1, 201)
    dip = _run(np.r_[np.linspace(0.0, 1.0, 50), np.ones(150)] - 0.5 * np.clip(1 - np.abs(steps - 120) / 30, 0, None))
    assert backtest.stopped_in_recovering_dip(dip, 120)  # at the bottom of the dip; the run gets back to 1 afterwards
    assert backtest.score(dip, 119)["dip_stop"] and backtest.score(dip, 119)["regret"] > 0.05
    assert not backtest.stopped_in_recovering_dip(dip, 40)  # during the rise: no dip
    assert not backtest.stopped_in_recovering_dip(dip, 180)  # after the recovery
    fall = _run(np.r_[np.linspace(0.0, 1.0, 50), np.linspace(1.0, 0.3, 150)])
    assert not backtest.stopped_in_recovering_dip(fall, 120)  # a fall that never comes back is not a dip


def test_a_dip_is_measured_against_the_noise_the_smoother_wanders_by() -> None:
    """A real dip lies many noise SDs deep; on a flat log that only jitters, a "dip" the smoother finds is about one."""
    steps = np.arange(1, 201)
    rng = np.random.default_rng(3)
    dip = _run(np.r_[np.linspace(0.0, 1.0, 50), np.ones(150)] - 0.5 * np.clip(1 - np.abs(steps - 120) / 30, 0, None) + rng.normal(0, 0.05, 200))
    assert backtest.score(dip, 119)["dip_z"] > 5 * backtest.DIP_NOISE_Z
    flat = _run(rng.choice([1.77, 2.36, 2.94], 200))  # a batch mean that jitters between the values of a few prompts
    z = [scoring.dip_noise_z(flat.steps, flat.rewards, stop) for stop in range(60, 180, 5)]
    assert 0 < max(z) < 3 and np.median(z) < backtest.DIP_NOISE_Z
    assert scoring.dip_noise_z(dip.steps, dip.rewards, 40) == 0.0  # during the rise: at its best so far


def _trace(run: bg.RunLog, default: np.ndarray | None = None) -> backtest.RunTrace:
    """A trace whose Bayesian decisions are given, to score the baselines and the bookkeeping on their own."""
    indices, fractions = backtest.check_indices(run)
    default = np.zeros(indices.size, bool) if default is None else default
    return backtest.RunTrace(run, "a/b", indices, fractions, default.astype(float), default, (0.9,), default[None], np.full(indices.size, np.nan))


def _rule_decisions(run: bg.RunLog, rule: StopRule) -> np.ndarray:
    """A rule object's decision at each check of ``run``, from the shipped model's forecast there (as ``trace`` asks it)."""
    model = bg.default_model()
    run = run.with_meta(total_steps=run.last_step)
    indices, _ = backtest.check_indices(run)
    return np.array([rule.decide(model.forecast(run.head(int(run.steps[i])), n_draws=100, seed=0)).should_stop for i in indices])


def test_baselines_fixed_patience_optuna_and_oracle() -> None:
    run = _run(RISE_THEN_FLAT + 0.01 * np.cos(np.arange(100)))
    tr = _trace(run)
    fixed = _rule_decisions(run, FixedFractionRule(0.4))
    assert tr.fractions[np.argmax(fixed)] == pytest.approx(0.4) and fixed.sum() == np.sum(tr.fractions >= 0.4 - 1e-9)
    rising_run = _run(np.linspace(0.0, 1.0, 100))
    assert not _rule_decisions(rising_run, PatienceRule(0.1)).any() and not backtest.optuna_patient_rule(5)(_trace(rising_run)).any()
    peaked_run = _run(np.r_[np.linspace(0.0, 1.0, 40), np.linspace(1.0, 0.6, 60)])
    peaked = _trace(peaked_run)
    for decisions in (_rule_decisions(peaked_run, PatienceRule(0.1)), backtest.optuna_patient_rule(5)(peaked)):
        assert decisions.any() and peaked.fractions[np.argmax(decisions)] > 0.4  # only after the peak
    oracle = backtest.oracle_rule()(tr)
    first = int(tr.indices[np.argmax(oracle)])
    assert scoring.regret(run.steps, run.rewards, int(run.steps[first])) <= backtest.ORACLE_REGRET
    assert all(scoring.regret(run.steps, run.rewards, int(run.steps[i])) > backtest.ORACLE_REGRET for i in tr.indices[: np.argmax(oracle)])


def test_paper_epoch_baseline_uses_the_declared_epoch_else_the_planned_run() -> None:
    run = _run(RISE_THEN_FLAT)  # no steps_per_epoch: the run is taken as one epoch
    tr = _trace(run)
    assert np.array_equal(backtest.epoch_fraction(0.8)(tr), tr.fractions >= 0.8 - 1e-9)
    declared = _trace(run.with_meta(steps_per_epoch=50))  # two epochs logged: stop at 40 of 100 steps
    stops = backtest.epoch_fraction(0.8)(declared)
    assert declared.fractions[np.argmax(stops)] == pytest.approx(0.4) and stops.sum() == np.sum(declared.fractions >= 0.4 - 1e-9)
    assert not backtest.epoch_fraction(0.8)(_trace(run.with_meta(steps_per_epoch=400))).any()  # the epoch outlasts the log
    assert "paper: 80% of an epoch" in backtest.baseline_rules()


def test_results_count_stops_regret_and_flips() -> None:
    run = _run(RISE_THEN_FLAT)
    tr = _trace(run)
    flicker = np.zeros(tr.indices.size, bool)
    flicker[[5, 7, 8]] = True  # stop, continue, stop, stop, continue...
    tr = _trace(run, flicker)
    tr.rule_decisions = {"fixed 80%": tr.fractions >= 0.8 - 1e-9}  # what FixedFractionRule(0.8) says at these checks
    results = backtest.evaluate([tr], baselines={})
    bayes = results[results["rule"] == backtest.DEFAULT_RULE].iloc[0]
    assert bayes["stop_step"] == run.steps[tr.indices[5]] and bayes["flip_back"]
    assert bayes["flip_rate"] == pytest.approx(4 / (tr.indices.size - 1))
    fixed = results[results["rule"] == "fixed 80%"].iloc[0]
    assert fixed["saved"] == pytest.approx(0.2) and not fixed["flip_back"]
    table = backtest.summarise(results)
    assert list(table["rule"]) == [backtest.DEFAULT_RULE, "bayes_grpo threshold", "fixed 80%"]
    assert {"mean_saved", "median_regret", "share_regret_gt_0.05", "share_regret_gt_0.10", "flip_rate"} <= set(table.columns)
    fig = backtest.tradeoff_figure(table)
    assert fig.axes and fig.axes[0].get_xlabel() == "share of runs with regret > 0.05"


def _evidence_trace(run: bg.RunLog, fold: int) -> backtest.RunTrace:
    """A trace whose stored evidence says "no gain left" at every check, held out in ``fold``."""
    tr = _trace(run)
    tr.fold = fold
    tr.evidence = [
        StopEvidence(
            step=int(run.steps[i]), total_steps=int(run.steps[-1]), gain=np.zeros(50), rise=np.zeros(50), spread=1.0,
            best_step=int(run.steps[i]), drop=0.0, drop_se=0.0, recovery=1.0,
        )
        for i in tr.indices
    ]
    return tr


def test_nested_selection_picks_on_the_other_folds_and_scores_the_held_out_one() -> None:
    flat = [_evidence_trace(_run(0.5 + 0.001 * np.cos(np.arange(100) + k), run_id=f"flat{k}"), fold=0) for k in range(3)]
    rising = [_evidence_trace(_run(RISE_THEN_FLAT + 0.001 * np.cos(np.arange(100) + k), run_id=f"rise{k}"), fold=1) for k in range(3)]
    early, late = backtest.RuleSetting(0.9, 0.01, 0.2), backtest.RuleSetting(0.9, 0.01, 0.6)
    assert backtest.setting_decisions(flat[0], early).tolist() == list(flat[0].fractions >= 0.2 - 1e-9)
    selection = backtest.nested_selection(flat + rising, [early, late])
    picks = selection.picks.set_index("fold")
    # Held-out flat runs: the rising runs forbid the early stop. Held-out rising runs: the flat runs allow it,
    # and it is scored as the bad stop it is on them.
    assert picks.loc[0, "min_fraction"] == 0.6 and picks.loc[1, "min_fraction"] == 0.2
    assert picks.loc[1, "feasible"] and picks.loc[1, "held_out_share_regret_gt_0.05"] == 1.0
    rows = selection.results.set_index("run_id")
    assert set(rows["rule"]) == {backtest.NESTED_RULE} and len(rows) == 6
    assert rows.loc["flat0", "stop_step"] == 60 and rows.loc["rise0", "stop_step"] == 20 and rows.loc["rise0", "regret"] > 0.05
    # Rises ending at steps 30, 50 and 80: both settings stop one or more of them too early, the later one fewer.
    uneven = [_evidence_trace(_run(np.minimum(np.arange(100) / end, 1.0), run_id=f"uneven{end}"), fold=1) for end in (30, 50, 80)]
    fewest_bad = backtest.nested_selection(flat + uneven, [early, late]).picks.set_index("fold")
    assert not fewest_bad.loc[0, "feasible"] and fewest_bad.loc[0, "min_fraction"] == 0.6
    assert fewest_bad.loc[0, "train_share_regret_gt_0.05"] == pytest.approx(1 / 3)
    with pytest.raises(BayesGrpoError):
        backtest.nested_selection(flat, [early])  # one fold: nothing to hold out


@pytest.mark.slow
def test_grouped_backtest_replays_real_runs_with_a_real_model(quick_model) -> None:
    if shared_runs_dir() is None:
        pytest.skip("needs the shared external runs (../shared/external_runs)")
    runs, sources = load_evaluation_runs(bundled=False, max_runs=2, seed=4)
    result = backtest.backtest(runs, sources, n_folds=2, model=quick_model, thresholds=(0.5, 0.99), every=0.2, progress=False)
    assert {tr.run.run_id for tr in result.traces} == {r.run_id for r in runs}
    for tr in result.traces:
        assert tr.indices.size == tr.probability.size == tr.by_threshold.shape[1] and tr.by_threshold.shape[0] == 2
        assert np.all((tr.probability >= 0) & (tr.probability <= 1))
        assert np.all(tr.by_threshold[1] <= tr.by_threshold[0])  # a higher threshold never stops where a lower one goes on
        assert tr.set == "real"
        assert len(tr.evidence) == tr.indices.size and tr.fold in (0, 1)
        assert np.array_equal(backtest.setting_decisions(tr, backtest.RuleSetting(0.99, bg.settings.STOP_TOLERANCE, 0.3)), tr.by_threshold[1])
    assert set(result.results["run_id"]) == {r.run_id for r in runs}
    assert result.selection is not None and len(result.selection.picks) == 2
    assert (result.results["rule"] == backtest.NESTED_RULE).sum() == len(runs)
    oracle = result.results[result.results["rule"].str.startswith("hindsight oracle")]
    assert (oracle["regret"] <= backtest.ORACLE_REGRET).all()
    assert list(result.folds["test_runs"]) == [1, 1]
    again = backtest.rescore(result.traces, result.folds)  # the rules scored again from the stored evidence
    pd.testing.assert_frame_equal(again.results, result.results)


def test_a_backtest_of_one_set_replays_only_that_set(quick_model) -> None:
    if shared_runs_dir() is None:
        pytest.skip("needs the shared external runs (../shared/external_runs)")
    runs, sources = load_evaluation_runs()
    real = [r for r in runs if sources[r.run_id] != sources[runs[0].run_id] and not calibration.is_bundled(sources[r.run_id])][:1]
    bundled = [r for r in runs if calibration.is_bundled(sources[r.run_id])][:1]
    result = backtest.backtest(real + bundled, sources, n_folds=2, model=quick_model, thresholds=(0.99,), every=0.25, progress=False, scored="real")
    assert [tr.run.run_id for tr in result.traces] == [real[0].run_id] and result.traces[0].set == "real"
    assert set(result.results["run_id"]) == {real[0].run_id} and list(result.folds["test_runs"]) == [1]
