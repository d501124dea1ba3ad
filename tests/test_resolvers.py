"""One home for the planned length: every entry point gives the same bad plan the same error and the same words."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

import bayes_grpo as bg
from bayes_grpo.cli import main
from bayes_grpo.cli._common import _cli_wording
from bayes_grpo.errors import LogError, ModelError, PlanError
from bayes_grpo.integrations.optuna import ForecastPruner
from bayes_grpo.logs import normalise_family
from bayes_grpo.logs.plan import planned_length
from bayes_grpo.prepare import prepare_run
from bayes_grpo.sweeps import rank
from bayes_grpo.watching import watch

LAST_STEP = 40


def _log(folder: Path, name: str) -> Path:
    path = folder / f"{name}.csv"
    steps = np.arange(1, LAST_STEP + 1)
    pd.DataFrame({"step": steps, "reward": 0.2 + 0.5 * (1 - np.exp(-steps / 10.0))}).to_csv(path, index=False)
    return path


def _tail(message: str) -> str:
    """The message without the run or file it names (entry points name the run their own way)."""
    return message.split(": ", 1)[1]


@pytest.fixture(scope="module")
def model() -> bg.FittedModel:
    return bg.default_model()


@pytest.mark.parametrize("bad_plan", [0, LAST_STEP // 2])
def test_every_entry_point_refuses_a_bad_plan_with_one_error(tmp_path: Path, model: bg.FittedModel, bad_plan: int) -> None:
    path = _log(tmp_path, "run")
    other = _log(tmp_path, "other")
    run = bg.read_log(path)
    entry_points = {
        "read_log": lambda: bg.read_log(path, total_steps=bad_plan),
        "with_meta": lambda: run.with_meta(total_steps=bad_plan),
        "prepare_run": lambda: prepare_run(run, total_steps=bad_plan),
        "forecast": lambda: model.forecast(run, total_steps=bad_plan),
        "stop_decision": lambda: model.stop_decision(run, total_steps=bad_plan),
        "rank": lambda: rank(model, [run, bg.read_log(other)], total_steps=bad_plan),
        "watch": lambda: next(watch(path, model=model, total_steps=bad_plan, once=True)),
    }
    if bad_plan < 1:
        entry_points["ForecastPruner"] = lambda: ForecastPruner(model=model, total_steps=bad_plan)
    tails = {}
    for name, call in entry_points.items():
        with pytest.raises(PlanError) as caught:
            call()
        tails[name] = _tail(str(caught.value))
    assert len(set(tails.values())) == 1, tails
    if bad_plan >= 1:  # the command line says the same, in its own words for the flag
        assert main(["forecast", str(path), "--total-steps", str(bad_plan)]) == 2


def test_the_cli_words_a_bad_plan_as_the_library_does(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _log(tmp_path, "run")
    with pytest.raises(PlanError) as caught:
        bg.read_log(path, total_steps=10)
    assert main(["forecast", str(path), "--total-steps", "10"]) == 2
    err = capsys.readouterr().err.strip()
    expected = _cli_wording(_tail(str(caught.value)), argparse.Namespace(total_steps=10))
    assert err.endswith(expected), (err, expected)


def test_a_plan_error_is_both_a_log_and_a_model_error() -> None:
    with pytest.raises(LogError):
        planned_length(None)
    with pytest.raises(ModelError):
        planned_length(3, last_step=5)


@given(st.one_of(st.integers(-5, 0), st.floats(allow_nan=True), st.booleans(), st.text(max_size=3)))
def test_anything_but_a_whole_number_of_at_least_one_is_refused(value: object) -> None:
    if isinstance(value, float) and value.is_integer() and value >= 1:
        assert planned_length(value) == int(value)
        return
    with pytest.raises(PlanError, match="total_steps must be a whole number >= 1"):
        planned_length(value)


@given(st.integers(1, 10**7), st.integers(0, 10**7))
def test_a_plan_is_accepted_exactly_when_it_does_not_precede_the_log(total: int, last: int) -> None:
    if total >= last:
        assert planned_length(total, last_step=last) == total
    else:
        with pytest.raises(PlanError, match=f"total_steps={total} is before the last logged step {last}"):
            planned_length(total, last_step=last)


@pytest.mark.parametrize("given", ["Qwen2.5", "qwen2", "Qwen3", "LLaMA-3.1"])
def test_every_entry_point_names_a_family_as_the_loaders_do(tmp_path: Path, model: bg.FittedModel, given: str) -> None:
    path = _log(tmp_path, "run")
    expected = normalise_family(given)
    run = bg.read_log(path, family=given)
    assert run.family == expected
    assert prepare_run(bg.read_log(path), family=given, total_steps=60).family == expected  # the override path
    assert model.forecast(bg.read_log(path), family=given, total_steps=60).prepared.family == expected
    assert ForecastPruner(model=model, family=given).defaults["family"] == expected
    assert bg.PlateauStoppingCallback(family=given).family == expected
