"""Source-capped summaries: each source counts as at most SOURCE_CAP runs (calibration and stopping backtest)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bayes_grpo import measures
from bayes_grpo.errors import BayesGrpoError
from evaluation import backtest, calibration

SWEEP, SINGLES = 17, 3


def _scores(sweep_covered: bool = False, singles_covered: bool = True, fractions=(0.3,), singles: int = SINGLES) -> pd.DataFrame:
    """A sweep of 17 runs of one source and single runs of other sources, with every column :func:`calibration.summarise` reads."""
    rows = []
    for fraction in fractions:
        for i in range(SWEEP + singles):
            sweep = i < SWEEP
            covered = sweep_covered if sweep else singles_covered
            rows.append({
                "run_id": f"r{i}", "fraction": fraction, "source": "sweep" if sweep else f"single{i}", "set": "real",
                "error": 1.0 if sweep else 0.2, "persistence_error": 1.0, "paper_law_error": 1.0,
                "covered_90": covered, "covered_50": covered, "above_q95": not covered, "below_q05": False,
                "width_90": 1.0 if sweep else 0.5, "quantile_score": 0.3 if sweep else 0.1,
                "change_after_cut": 2.0 + i / 100 if sweep else 0.01 * i, "ess": 100.0, "pareto_k": 0.1,
            })  # fmt: skip
    return pd.DataFrame(rows)


def test_a_source_of_17_runs_weighs_3_and_small_sources_weigh_their_runs():
    weights = calibration.source_weights(_scores())
    assert weights[:SWEEP].tolist() == pytest.approx([3 / 17] * SWEEP) and weights[:SWEEP].sum() == pytest.approx(3.0)
    assert weights[SWEEP:].tolist() == [1.0] * SINGLES
    frame = pd.DataFrame({"source": ["a", "a", "a", "b", "b"]})
    assert calibration.source_weights(frame).tolist() == [1.0] * 5  # at most 3 runs: every run counts
    assert calibration.source_weights(frame, cap=1).tolist() == pytest.approx([1 / 3] * 3 + [1 / 2] * 2)


def test_weights_are_counted_within_each_group():
    scores = _scores(fractions=(0.2, 0.5))
    late = scores["fraction"] == 0.5
    scores = scores[~late | ~scores["run_id"].isin([f"r{i}" for i in range(3, SWEEP)])]  # only 3 sweep runs scored at 50%
    weights = calibration.source_weights(scores, ("fraction",))
    assert weights[(scores["fraction"] == 0.2) & (scores["source"] == "sweep")].sum() == pytest.approx(3.0)
    assert weights[(scores["fraction"] == 0.5)].tolist() == [1.0] * 6


def test_weights_need_sources_and_a_positive_cap():
    with pytest.raises(BayesGrpoError, match="source"):
        calibration.source_weights(pd.DataFrame({"run_id": ["a"]}))
    with pytest.raises(BayesGrpoError, match="positive"):
        calibration.source_weights(_scores(), cap=0)


def test_capped_summary_stops_a_sweep_outvoting_single_runs():
    scores = _scores(sweep_covered=False, singles_covered=True)
    plain = calibration.summarise(scores).iloc[0]
    capped = calibration.summarise(scores, source_cap=calibration.SOURCE_CAP).iloc[0]
    assert plain["runs"] == plain["weight"] == 20 and plain["coverage_90"] == pytest.approx(3 / 20)
    assert capped["runs"] == 20 and capped["weight"] == pytest.approx(6.0)
    assert capped["coverage_90"] == pytest.approx(3 / 6) and capped["above_q95"] == pytest.approx(3 / 6)
    assert capped["error"] == pytest.approx((3 * 1.0 + 3 * 0.2) / 6) and capped["quantile_score"] == pytest.approx((3 * 0.3 + 3 * 0.1) / 6)
    assert capped["width_90_median"] == pytest.approx(0.75)  # half the weight at 0.5, half at 1.0
    assert capped["ratio_to_persistence"] == pytest.approx(capped["error"] / capped["persistence"])


def test_run_weighted_summary_is_the_plain_mean_and_median():
    scores = _scores()
    table = calibration.summarise(scores).iloc[0]
    assert table["error"] == pytest.approx(scores["error"].mean()) and table["width_90_median"] == pytest.approx(scores["width_90"].median())
    assert table["coverage_50"] == pytest.approx(scores["covered_50"].mean()) and table["below_q05"] == 0.0


def test_capped_hardest_third_is_a_third_of_the_capped_weight():
    scores = _scores(singles=9)  # the sweep has the largest changes after the cut; it weighs 3 of 12 once capped
    plain = calibration.hardest(scores)
    assert set(plain["source"]) == {"sweep"} and len(plain) == 9  # a third of 26 rows: sweep runs only
    capped = calibration.hardest(scores, source_cap=calibration.SOURCE_CAP)
    assert set(capped["source"]) == {"sweep", "single25"}  # a third of the weight is 4: the whole sweep and the hardest single run
    assert (capped["source"] == "sweep").sum() == SWEEP
    tables = calibration.summary_tables(_scores())
    assert calibration.REAL_CAPPED in tables and "real runs, hardest third, source-capped" in tables
    assert tables[calibration.REAL_CAPPED]["weight"].iloc[0] == pytest.approx(6.0)


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=30), q=st.floats(0.0, 1.0), scale=st.floats(0.01, 100.0))
def test_weighted_quantile_is_the_median_with_equal_weights_and_stays_in_range(values, q, scale):
    assert measures.weighted_quantile(values, 0.5) == pytest.approx(float(np.median(values)), abs=1e-9)
    weights = np.linspace(1.0, 2.0, len(values))
    value = measures.weighted_quantile(values, q, weights)
    assert min(values) - 1e-9 <= value <= max(values) + 1e-9
    assert measures.weighted_quantile(values, q, scale * weights) == pytest.approx(value, abs=1e-9)  # only relative weights matter


def test_weighted_quantile_ignores_nan_and_zero_weights():
    assert measures.weighted_quantile([1.0, np.nan, 3.0], 0.5) == 2.0
    assert measures.weighted_quantile([1.0, 100.0, 3.0], 0.5, [1.0, 0.0, 1.0]) == 2.0
    assert np.isnan(measures.weighted_quantile([np.nan], 0.5))


def _backtest_rows() -> pd.DataFrame:
    rows = []
    for i in range(SWEEP + SINGLES):
        sweep = i < SWEEP
        for rule, threshold in ((backtest.DEFAULT_RULE, np.nan), ("bayes_grpo threshold", 0.9)):
            rows.append({
                "run_id": f"r{i}", "source": "sweep" if sweep else f"single{i}", "set": "real", "rule": rule, "threshold": threshold,
                "checks": 10, "stop_step": 50, "saved": 0.5 if sweep else 0.0, "regret": 0.2 if sweep else 0.0, "dip_stop": sweep,
                "dip_z": 3.0 if sweep and i % 2 else np.nan,
                "noise_bad": 0.1 if sweep else 0.0, "flip_rate": 0.1, "flip_back": sweep,
            })  # fmt: skip
    return pd.DataFrame(rows)


def test_backtest_capped_summary_counts_the_sweep_as_3_runs():
    results = _backtest_rows()
    plain = backtest.summarise(results)
    capped = backtest.summarise_source_capped(results)
    assert list(capped["rule"]) == list(plain["rule"]) and capped["threshold"].isna().tolist() == plain["threshold"].isna().tolist()
    row = capped.iloc[0]
    assert plain.iloc[0]["share_regret_gt_0.05"] == pytest.approx(17 / 20) and row["share_regret_gt_0.05"] == pytest.approx(0.5)
    assert row["weight"] == pytest.approx(6.0) and row["mean_saved"] == pytest.approx(0.25) and row["share_stopped"] == pytest.approx(0.5)
    assert row["share_flip_back"] == pytest.approx(0.5) and row["share_dip_stops"] == pytest.approx(0.5) and row["median_regret"] == pytest.approx(0.1)
    assert row["noise_bad"] == pytest.approx(0.05) and row["share_dip_stops_beyond_noise"] == pytest.approx(8 * 3 / 17 / 6)  # the 8 odd sweep runs
    uncapped = backtest.summarise_source_capped(results, cap=1e9).drop(columns="weight")
    pd.testing.assert_frame_equal(uncapped, plain, check_dtype=False)
