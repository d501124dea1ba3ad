"""A stop rule written by a user (one class, one method) runs in the forecast API, the CLI, the callback and the backtest."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_callback import _train, rising_reward

import bayes_grpo as bg
from bayes_grpo.cli import main
from bayes_grpo.errors import BayesGrpoError
from bayes_grpo.stopping import FixedFractionRule, PatienceRule, PlateauRule, StopRule, decision_from_forecast, load_rule
from evaluation.backtest import evaluate, trace

USER_RULES = textwrap.dedent(
    '''
    from bayes_grpo.stopping import StopRule


    class StopAtHalf(StopRule):
        """Stop once half the planned steps are done."""

        def decide(self, forecast):
            half_way = (forecast.last_observed_step or 0) >= forecast.total_steps / 2
            return self.decision(forecast, half_way, "half", "half the planned steps are done" if half_way else "not half way yet")
    '''
)


class StopAtHalf(StopRule):
    def decide(self, forecast):  # type: ignore[no-untyped-def]
        half_way = (forecast.last_observed_step or 0) >= forecast.total_steps / 2
        return self.decision(forecast, half_way, "half", "half the planned steps are done" if half_way else "not half way yet")


def _run(total: int = 100, last: int = 60) -> bg.RunLog:
    steps = np.arange(1, last + 1)
    rewards = 0.1 + 0.6 * (1 - np.exp(-steps / 15.0)) + 0.02 * np.random.default_rng(0).standard_normal(last)
    return bg.read_log(pd.DataFrame({"step": steps, "reward": rewards}), total_steps=total, run_id="user-rule")


@pytest.fixture(scope="module")
def model() -> bg.FittedModel:
    return bg.default_model()


def test_a_user_rule_decides_from_a_forecast_and_explains_itself(model: bg.FittedModel) -> None:
    run = _run()
    early = model.stop_decision(run.head(30), rule=StopAtHalf(), n_draws=200)
    late = model.stop_decision(run, rule=StopAtHalf(), n_draws=200)
    assert not early.should_stop and late.should_stop and late.rule == "StopAtHalf" and late.reason == "half"
    assert "by StopAtHalf: half the planned steps are done" in late.explain() and 0 < late.best_step <= 60
    assert late.compute_saved == pytest.approx(0.4)


def test_the_package_rules_are_rule_objects(model: bg.FittedModel) -> None:
    fc = model.forecast(_run(), n_draws=200)
    default = decision_from_forecast(fc)
    by_object = PlateauRule().decide(fc)
    assert (by_object.should_stop, by_object.reason, by_object.probability) == (default.should_stop, default.reason, default.probability)
    assert default.rule == "PlateauRule"
    assert FixedFractionRule(0.5).decide(fc).should_stop and not FixedFractionRule(0.7).decide(fc).should_stop
    patient = PatienceRule(patience=0.05).decide(fc)
    assert patient.rule == "PatienceRule" and "patience 5% of the plan" in patient.explain()
    with pytest.raises(bg.ModelError, match="fraction must be in"):
        FixedFractionRule(0.0)


def test_the_cli_takes_a_user_rule_from_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "my_rules.py").write_text(USER_RULES)
    log = tmp_path / "run.csv"
    _run().table[["step", "reward"]].assign(total_steps=100).to_csv(log, index=False)
    assert main(["stop", str(log), "--rule", f"{tmp_path / 'my_rules.py'}:StopAtHalf"]) == 0
    assert "Stop now at step 60 of 100 by StopAtHalf: half the planned steps are done" in capsys.readouterr().out
    assert main(["stop", str(log), "--rule", "bayes_grpo.stopping:NoSuchRule"]) == 2
    assert "bayes_grpo.stopping has no NoSuchRule" in capsys.readouterr().err


def test_load_rule_refuses_what_is_not_a_rule(tmp_path: Path) -> None:
    with pytest.raises(BayesGrpoError, match="module:Class"):
        load_rule("StopAtHalf")
    with pytest.raises(BayesGrpoError, match="is not a stop rule"):
        load_rule("bayes_grpo.settings:STOP_THRESHOLD")
    with pytest.raises(BayesGrpoError, match="does not exist"):
        load_rule(f"{tmp_path / 'missing.py'}:StopAtHalf")


def test_the_callback_stops_training_where_a_user_rule_says(tmp_path: Path) -> None:
    callback = bg.PlateauStoppingCallback(bg.default_model(), rule=StopAtHalf(), check_every=5, min_fraction=0.1, verbose=False, n_draws=100)
    trainer = _train(rising_reward(), callback, tmp_path)
    assert callback.stopped_at == 20 and trainer.state.global_step == 20
    assert callback.decisions[-1].rule == "StopAtHalf" and callback.decisions[-1].should_stop


def test_the_backtest_replays_a_user_rule_beside_the_baselines(model: bg.FittedModel) -> None:
    run = _run(total=60)
    replay = trace(model, run, rules={"half": StopAtHalf(), "fixed 80%": FixedFractionRule(0.8)}, forecast_options={"n_draws": 100}, every=0.1)
    half = replay.rule_decisions["half"]
    assert half.tolist() == (replay.fractions >= 0.5 - 1e-9).tolist()
    results = evaluate([replay], baselines={})
    rows = results.set_index("rule")
    assert rows.loc["half", "stop_step"] == run.steps[replay.indices[np.argmax(half)]]
    assert rows.loc["fixed 80%", "saved"] == pytest.approx(1 - rows.loc["fixed 80%", "stop_step"] / 60)
